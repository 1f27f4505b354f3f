//! `cargo xtask interop --rxe-pair`: the perftest matrix between two rxe
//! VMs, the reference for "is this rxe or us?" and for comparing our
//! numbers with rxe's own on the same emulated hardware.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use rxevm::VmId;

use crate::interop::{
    boot, case_capture, guest_tail, perf_matrix, result_iters, summary, CounterWatch,
};

/// One perftest test: server in VM a, client in VM b.
struct PairCase {
    name: String,
    server: String,
    client: String,
    bytes: usize,
    iters: u64,
}

fn cases() -> Vec<PairCase> {
    let mut v = Vec::new();
    for (tool, _, sizes) in perf_matrix(false) {
        for &s in *sizes {
            let n = if s >= 1 << 20 { 5 } else { 20 };
            let size_arg = if *tool == "atomic_lat" {
                String::new()
            } else {
                format!(" -s {s}")
            };
            // As against us: rxe's timer fires spuriously one timeout after
            // the last ACK (see interop's long_timeout).
            let u = if s >= 1 << 20 && tool.ends_with("_lat") {
                " -u 18"
            } else {
                ""
            };
            let server = format!("ib_{tool} -d rxe0 -x 1{size_arg} -n {n}{u}");
            v.push(PairCase {
                name: format!("ib_{tool}{size_arg} -n {n}{u}, rxe a <- rxe b"),
                client: format!("{server} {}", VmId::A.ip()),
                server,
                bytes: if *tool == "atomic_lat" { 8 } else { s },
                iters: n,
            });
        }
    }
    v
}

/// The client's headline numbers: t_typical for latency, BW average and
/// message rate for bandwidth (perftest's column order).
fn headline(out: &str, bytes: usize, lat: bool) -> String {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(&bytes.to_string()))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if lat {
                Some(format!("t_typical {} usec", f.get(4)?))
            } else {
                Some(format!(
                    "BW average {} MB/sec, {} Mpps",
                    f.get(3)?,
                    f.get(4)?
                ))
            }
        })
        .unwrap_or_default()
}

pub(crate) fn rxe_pair(only: Option<&str>, keep: bool, capture_dir: Option<&Path>) -> Result<()> {
    let t0 = Instant::now();
    let (lab, booted) = boot(&[VmId::A, VmId::B], keep)?;
    println!("rxe VMs: {booted}");
    let mut watch = CounterWatch::new(&lab, &[VmId::A, VmId::B]);
    let mut results = Vec::new();
    for c in cases()
        .iter()
        .filter(|c| only.is_none_or(|o| c.name.contains(o)))
    {
        let cap = case_capture(&lab, capture_dir, &c.name);
        watch.case_start();
        let start = Instant::now();
        let r = (|| -> Result<String> {
            let job = lab.spawn(VmId::A, &c.server)?;
            std::thread::sleep(Duration::from_secs(2));
            let client = lab.exec(VmId::B, &c.client, Duration::from_secs(180))?;
            if !client.success() {
                lab.kill(&job);
            }
            let server = lab.wait(&job, Duration::from_secs(60))?;
            if !client.success() {
                bail!("client: {}", guest_tail(&client));
            }
            if !server.success() {
                bail!("server: {}", guest_tail(&server));
            }
            let ci = result_iters(&client.stdout, c.bytes);
            let si = result_iters(&server.stdout, c.bytes);
            if ci.is_empty() || ci.iter().chain(&si).any(|&i| i != c.iters) {
                bail!(
                    "result lines for {} B show iterations {ci:?} (client) {si:?} (server), want {}",
                    c.bytes,
                    c.iters
                );
            }
            Ok(headline(&client.stdout, c.bytes, c.name.contains("_lat")))
        })();
        let secs = start.elapsed().as_secs_f64();
        drop(cap);
        let note = watch.case_end(&c.name);
        match &r {
            Ok(h) => println!("PASS  {:<55} {secs:>6.1} s  {h}{note}", c.name),
            Err(e) => println!("FAIL  {:<55} {secs:>6.1} s  {e:#}{note}", c.name),
        }
        results.push(r.is_ok());
    }
    let (ok, line) = watch.verdict();
    println!("{line}");
    results.push(ok);
    summary("rxe pair", &results, &booted, t0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_reads_perftests_columns() {
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]\n 2       20          1021.50        4000.10      1100.25        1200.0\n";
        assert_eq!(headline(lat, 2, true), "t_typical 1100.25 usec");
        let bw = " 5000       20             12.34              11.50                0.002412\n";
        assert_eq!(
            headline(bw, 5000, false),
            "BW average 11.50 MB/sec, 0.002412 Mpps"
        );
        assert_eq!(headline(bw, 64, false), "");
    }

    #[test]
    fn every_case_names_its_server_address() {
        for c in cases() {
            assert!(c.client.ends_with(" 10.99.0.2"), "{}", c.client);
            assert!(!c.server.contains("10.99"));
        }
    }
}
