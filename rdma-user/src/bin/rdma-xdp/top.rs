//! `rdma-xdp top`: a live view of a daemon's QPs, refreshed each interval:
//! rates, bytes, packets, retransmits, NAKs, RNR NAKs, CNPs sent and
//! handled, DCQCN's current rate and α, and RTT percentiles. Keys sort and filter;
//! `--once [--json]` prints one sample for scripts.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Cell, Paragraph, Row as TRow, Table};
use ratatui::Frame;
use rdma_user::control::proto::Request;
use serde::Serialize;
use serde_json::Value;

use crate::control::call;
use crate::Global;

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum SortKey {
    Qpn,
    Rate,
    Bytes,
    Retransmits,
    Cnps,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Qpn => SortKey::Rate,
            SortKey::Rate => SortKey::Bytes,
            SortKey::Bytes => SortKey::Retransmits,
            SortKey::Retransmits => SortKey::Cnps,
            SortKey::Cnps => SortKey::Qpn,
        }
    }
}

#[derive(Args)]
pub struct TopArgs {
    /// Seconds between refreshes (rates are over this interval).
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// One sample (two snapshots an interval apart), printed, then exit.
    #[arg(long)]
    pub once: bool,
    #[arg(long, value_enum, default_value_t = SortKey::Rate)]
    pub sort: SortKey,
    /// Only QPs whose QPN, peer, type or state contains this.
    #[arg(long)]
    pub filter: Option<String>,
}

/// One QP over one interval.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Row {
    pub qpn: u32,
    pub qp_type: String,
    pub state: String,
    pub peer: String,
    pub tx_mbps: f64,
    pub rx_mbps: f64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub rx_packets: u64,
    pub retransmits: u64,
    /// Sequence NAKs sent and received.
    pub naks: u64,
    /// RNR NAKs sent and received.
    pub rnr_naks: u64,
    /// CNPs this QP sent (its notification point) and received (its
    /// reaction point: handled plus ignored).
    pub cnps_sent: u64,
    pub cnps_received: u64,
    pub dcqcn_rate_mbps: f64,
    pub dcqcn_alpha: f64,
    /// Round-trip time percentiles (µs, upper bounds of log2 buckets) over
    /// the QP's life; None before the first sample.
    pub rtt_p50_us: Option<u64>,
    pub rtt_p99_us: Option<u64>,
}

fn u(v: &Value, k: &str) -> u64 {
    v["stats"][k].as_u64().unwrap_or(0)
}

/// The rows of a `qp list` answer, with rates from the one `dt` before.
pub fn rows(prev: Option<&Value>, cur: &Value, dt: f64) -> Vec<Row> {
    let empty = Vec::new();
    let prev_qps = prev.and_then(|p| p["qps"].as_array()).unwrap_or(&empty);
    cur["qps"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|q| {
            let qpn = q["qpn"].as_u64().unwrap_or(0) as u32;
            let before = prev_qps.iter().find(|p| p["qpn"] == q["qpn"]);
            let rate = |k: &str| match before {
                Some(b) if dt > 0.0 => u(q, k).saturating_sub(u(b, k)) as f64 * 8.0 / dt / 1e6,
                _ => 0.0,
            };
            Row {
                qpn,
                qp_type: q["type"].as_str().unwrap_or("").into(),
                state: q["state"].as_str().unwrap_or("").into(),
                peer: q["peer"].as_str().unwrap_or("-").into(),
                tx_mbps: rate("tx_bytes"),
                rx_mbps: rate("rx_bytes"),
                tx_bytes: u(q, "tx_bytes"),
                rx_bytes: u(q, "rx_bytes"),
                tx_packets: u(q, "tx"),
                rx_packets: u(q, "rx"),
                retransmits: u(q, "retransmits"),
                naks: u(q, "seq_naks_sent") + u(q, "seq_naks_received"),
                rnr_naks: u(q, "rnr_naks_sent") + u(q, "rnr_naks_received"),
                cnps_sent: u(q, "np_cnp_sent"),
                cnps_received: u(q, "rp_cnp_handled") + u(q, "rp_cnp_ignored"),
                dcqcn_rate_mbps: q["dcqcn"]["rate_mbps"].as_f64().unwrap_or(0.0),
                dcqcn_alpha: q["dcqcn"]["alpha"].as_f64().unwrap_or(0.0),
                rtt_p50_us: q["rtt_us"]["p50"].as_u64(),
                rtt_p99_us: q["rtt_us"]["p99"].as_u64(),
            }
        })
        .collect()
}

/// Filters and sorts (largest first, QPN ascending; `reverse` flips it).
pub fn arrange(mut rows: Vec<Row>, key: SortKey, reverse: bool, filter: &str) -> Vec<Row> {
    rows.retain(|r| {
        filter.is_empty()
            || [
                r.qpn.to_string(),
                format!("0x{:x}", r.qpn),
                r.peer.clone(),
                r.qp_type.clone(),
                r.state.clone(),
            ]
            .iter()
            .any(|s| s.contains(filter))
    });
    let k = |r: &Row| -> f64 {
        match key {
            SortKey::Qpn => -(r.qpn as f64),
            SortKey::Rate => r.tx_mbps + r.rx_mbps,
            SortKey::Bytes => (r.tx_bytes + r.rx_bytes) as f64,
            SortKey::Retransmits => r.retransmits as f64,
            SortKey::Cnps => (r.cnps_sent + r.cnps_received) as f64,
        }
    };
    rows.sort_by(|a, b| k(b).total_cmp(&k(a)).then(a.qpn.cmp(&b.qpn)));
    if reverse {
        rows.reverse();
    }
    rows
}

fn human(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

const HEADER: [&str; 16] = [
    "QPN",
    "type",
    "state",
    "peer",
    "tx Mb/s",
    "rx Mb/s",
    "tx",
    "rx",
    "pkts tx/rx",
    "retx",
    "NAK",
    "RNR",
    "CNP tx/rx",
    "DCQCN Mb/s",
    "alpha",
    "RTT p50/p99 us",
];

fn cells(r: &Row) -> [String; 16] {
    let us = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("<{v}"));
    [
        format!("0x{:x}", r.qpn),
        r.qp_type.clone(),
        r.state.clone(),
        r.peer.clone(),
        format!("{:.1}", r.tx_mbps),
        format!("{:.1}", r.rx_mbps),
        human(r.tx_bytes),
        human(r.rx_bytes),
        format!("{}/{}", r.tx_packets, r.rx_packets),
        r.retransmits.to_string(),
        r.naks.to_string(),
        r.rnr_naks.to_string(),
        format!("{}/{}", r.cnps_sent, r.cnps_received),
        format!("{:.0}", r.dcqcn_rate_mbps),
        format!("{:.3}", r.dcqcn_alpha),
        format!("{}/{}", us(r.rtt_p50_us), us(r.rtt_p99_us)),
    ]
}

/// What the screen shows besides the rows.
pub struct View {
    pub iface: String,
    pub sort: SortKey,
    pub reverse: bool,
    pub filter: String,
    /// Typing a filter (after `/`).
    pub editing: bool,
    pub error: Option<String>,
}

pub fn render(f: &mut Frame, rows: &[Row], v: &View) {
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let (tx, rx): (f64, f64) = rows
        .iter()
        .fold((0.0, 0.0), |(a, b), r| (a + r.tx_mbps, b + r.rx_mbps));
    f.render_widget(
        Paragraph::new(format!(
            "rdma-xdp top on {}: {} QPs, {:.1} Mb/s out, {:.1} Mb/s in; sort {:?}{}{}",
            v.iface,
            rows.len(),
            tx,
            rx,
            v.sort,
            if v.reverse { " (reversed)" } else { "" },
            if v.filter.is_empty() {
                String::new()
            } else {
                format!("; filter '{}'", v.filter)
            }
        )),
        head,
    );
    let widths = [
        Constraint::Length(8),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(15),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(15),
        Constraint::Length(7),
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(11),
        Constraint::Length(10),
        Constraint::Length(6),
        Constraint::Length(15),
    ];
    let table = Table::new(
        rows.iter().map(|r| TRow::new(cells(r).map(Cell::from))),
        widths,
    )
    .header(TRow::new(HEADER).style(Style::new().add_modifier(Modifier::BOLD)))
    .block(Block::bordered());
    f.render_widget(table, body);
    let help = match (&v.error, v.editing) {
        (Some(e), _) => format!("error: {e}"),
        (None, true) => format!("filter: {}_  (Enter: apply, Esc: clear)", v.filter),
        (None, false) => "q: quit  s: next sort key  r: reverse  /: filter".into(),
    };
    f.render_widget(Paragraph::new(help), foot);
}

pub fn top(a: TopArgs, g: &Global) -> Result<()> {
    if !(a.interval > 0.0 && a.interval.is_finite()) {
        bail!(
            "--interval {}: give a positive number of seconds",
            a.interval
        );
    }
    let dt = Duration::from_secs_f64(a.interval);
    let iface = g.iface.clone();
    let sample = || call(&iface, &Request::QpList);
    if a.once {
        let first = sample()?;
        std::thread::sleep(dt);
        let rows = arrange(
            rows(Some(&first), &sample()?, a.interval),
            a.sort,
            false,
            a.filter.as_deref().unwrap_or(""),
        );
        if g.json {
            println!("{}", serde_json::to_string_pretty(&rows)?);
        } else {
            println!("{}", HEADER.join("\t"));
            for r in &rows {
                println!("{}", cells(r).join("\t"));
            }
        }
        return Ok(());
    }
    let mut view = View {
        iface: iface.clone().unwrap_or_else(|| "the only daemon".into()),
        sort: a.sort,
        reverse: false,
        filter: a.filter.unwrap_or_default(),
        editing: false,
        error: None,
    };
    let mut term = ratatui::init();
    let r = (|| -> Result<()> {
        let mut prev: Option<(Value, Instant)> = None;
        let mut shown: Vec<Row> = Vec::new();
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                next = Instant::now() + dt;
                match sample() {
                    Ok(cur) => {
                        let secs = prev.as_ref().map_or(0.0, |p| p.1.elapsed().as_secs_f64());
                        shown = rows(prev.as_ref().map(|p| &p.0), &cur, secs);
                        prev = Some((cur, Instant::now()));
                        view.error = None;
                    }
                    Err(e) => view.error = Some(format!("{e:#}")),
                }
            }
            let list = arrange(shown.clone(), view.sort, view.reverse, &view.filter);
            term.draw(|f| render(f, &list, &view))?;
            let wait = next.saturating_duration_since(Instant::now());
            if !event::poll(wait)? {
                continue;
            }
            let Event::Key(k) = event::read()? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            if view.editing {
                match k.code {
                    KeyCode::Enter => view.editing = false,
                    KeyCode::Esc => {
                        view.filter.clear();
                        view.editing = false;
                    }
                    KeyCode::Backspace => {
                        view.filter.pop();
                    }
                    KeyCode::Char(c) => view.filter.push(c),
                    _ => {}
                }
                continue;
            }
            match k.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                KeyCode::Char('s') => view.sort = view.sort.next(),
                KeyCode::Char('r') => view.reverse = !view.reverse,
                KeyCode::Char('/') | KeyCode::Char('f') => view.editing = true,
                _ => {}
            }
        }
    })();
    ratatui::restore();
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;
    use serde_json::json;

    fn qp(qpn: u32, peer: &str, tx_bytes: u64, retx: u64, cnps: u64) -> Value {
        json!({
            "qpn": qpn, "type": "RC", "state": "RTS", "peer": peer,
            "stats": {"tx": tx_bytes / 1000, "rx": 7, "tx_bytes": tx_bytes, "rx_bytes": 0,
                      "retransmits": retx, "seq_naks_sent": 1, "seq_naks_received": 2,
                      "rnr_naks_sent": 0, "rnr_naks_received": 3,
                      "np_cnp_sent": 0, "rp_cnp_handled": cnps, "rp_cnp_ignored": 1},
            "dcqcn": {"rate_mbps": 250.0, "alpha": 0.5},
            "rtt_us": {"p50": 16, "p99": 128, "samples": 40}
        })
    }

    fn sample() -> Vec<Row> {
        let before = json!({"qps": [qp(0x11, "10.0.0.2", 0, 0, 0), qp(0x12, "10.0.0.3", 0, 0, 0)]});
        let after = json!({"qps": [qp(0x11, "10.0.0.2", 1_250_000, 4, 9), qp(0x12, "10.0.0.3", 12_500_000, 0, 2)]});
        rows(Some(&before), &after, 1.0)
    }

    #[test]
    fn rows_carry_rates_over_the_interval_and_sum_the_naks() {
        let r = sample();
        assert_eq!(r[0].qpn, 0x11);
        assert!((r[0].tx_mbps - 10.0).abs() < 1e-9 && (r[1].tx_mbps - 100.0).abs() < 1e-9);
        assert_eq!((r[0].naks, r[0].rnr_naks, r[0].cnps_received), (3, 3, 10));
        // A QP without an earlier snapshot has no rate yet.
        assert_eq!(
            rows(None, &json!({"qps": [qp(1, "x", 5, 0, 0)]}), 1.0)[0].tx_mbps,
            0.0
        );
    }

    #[test]
    fn keys_sort_and_filter() {
        let by_rate = arrange(sample(), SortKey::Rate, false, "");
        assert_eq!(
            by_rate.iter().map(|r| r.qpn).collect::<Vec<_>>(),
            [0x12, 0x11]
        );
        let by_retx = arrange(sample(), SortKey::Retransmits, false, "");
        assert_eq!(by_retx[0].qpn, 0x11);
        assert_eq!(arrange(sample(), SortKey::Qpn, false, "")[0].qpn, 0x11);
        assert_eq!(arrange(sample(), SortKey::Qpn, true, "")[0].qpn, 0x12);
        let only = arrange(sample(), SortKey::Rate, false, "10.0.0.2");
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].qpn, 0x11);
        assert_eq!(arrange(sample(), SortKey::Rate, false, "0x12")[0].qpn, 0x12);
        assert_eq!(SortKey::Cnps.next(), SortKey::Qpn);
    }

    #[test]
    fn the_screen_shows_every_column_of_every_row() {
        let mut t = Terminal::new(TestBackend::new(170, 8)).unwrap();
        let view = View {
            iface: "veth0".into(),
            sort: SortKey::Rate,
            reverse: false,
            filter: String::new(),
            editing: false,
            error: None,
        };
        let rows = arrange(sample(), view.sort, false, "");
        t.draw(|f| render(f, &rows, &view)).unwrap();
        let buf = t.backend().buffer();
        let line = |y: u16| -> String {
            (0..buf.area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect()
        };
        let screen: Vec<String> = (0..buf.area.height).map(line).collect();
        assert!(
            screen[0].contains("rdma-xdp top on veth0: 2 QPs, 110.0 Mb/s out"),
            "{screen:#?}"
        );
        assert!(
            screen[2].contains("QPN") && screen[2].contains("DCQCN Mb/s"),
            "{screen:#?}"
        );
        // Sorted by rate: 0x12 (100 Mb/s) first.
        assert!(
            screen[3].contains("0x12") && screen[3].contains("100.0"),
            "{screen:#?}"
        );
        assert!(
            screen[3].contains("11.9 MiB") && screen[3].contains("12500/7"),
            "{screen:#?}"
        );
        assert!(
            screen[4].contains("0x11") && screen[4].contains("0/10") && screen[4].contains("0.500"),
            "{screen:#?}"
        );
        assert!(screen[7].contains("q: quit"), "{screen:#?}");
    }
}
