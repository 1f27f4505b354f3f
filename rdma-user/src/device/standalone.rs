//! An in-process device: XDP program, AF_XDP sockets and data path owned and
//! polled by the calling thread, without a daemon. Test tools, interop
//! peers and benchmarks run on it (no control-plane hop in the timed path).
//!
//! It adds no behaviour to the data path: only ownership and polling.

use std::fs::File;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::device::datapath::{DataPath, Limits};
use crate::io::xdp::{XdpMode, XdpProgram};
use crate::io::xsk::{rx_queues, Xsk, XskBind, XskConfig};
use crate::transport::{Wc, WcOpcode, WcStatus};

pub struct Standalone {
    pub dp: DataPath,
    pub xdp: XdpProgram,
    pub iface: String,
    pub mac: [u8; 6],
    _lock: File,
}

pub const NO_WC: Wc = Wc {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Send,
    byte_len: 0,
    imm: None,
    qp_num: 0,
    solicited: false,
    src_qp: 0,
    grh: None,
};

/// What keeps a device's XDP program attached and its interface locked
/// while its data path runs elsewhere (see [`Standalone::split`]).
pub struct Attachment {
    pub xdp: XdpProgram,
    _lock: File,
}

impl Standalone {
    /// The data path, to move to a thread of its own, and the attachment
    /// to keep alive meanwhile (dropping it detaches XDP).
    pub fn split(self) -> (DataPath, Attachment) {
        (
            self.dp,
            Attachment {
                xdp: self.xdp,
                _lock: self._lock,
            },
        )
    }

    pub fn open(iface: &str, mode: XdpMode, multi_buffer: bool) -> Result<Standalone> {
        let lock = crate::device::runner::take_lock(iface)?;
        crate::device::runner::clean_stale(iface);
        let bind = XskBind::from_env()?;
        let mut xdp = XdpProgram::attach(iface, mode)?;
        let mut xsks = Vec::new();
        for q in 0..rx_queues(iface)? {
            let x = Xsk::open_with(
                iface,
                q,
                XskConfig {
                    multi_buffer,
                    ..Default::default()
                },
                bind,
            )
            .with_context(|| format!("AF_XDP socket on {iface} queue {q}"))?;
            xdp.set_socket(q, x.fd())?;
            xsks.push(x);
        }
        let mut dp = DataPath::new(xsks, Limits::default());
        // The XDP responder serves pool MRs (`Core::reg_mr_pool`); without
        // its maps everything takes the user path.
        match xdp.map_xdp_responder() {
            Ok(m) => dp
                .core
                .set_xdp_responder(crate::device::datapath::XdpResponder::new(m, iface)),
            Err(e) => log::debug!("{iface}: no XDP responder ({e:#})"),
        }
        Ok(Standalone {
            dp,
            xdp,
            iface: iface.to_string(),
            mac: crate::io::hostnet::iface_mac(iface)?,
            _lock: lock,
        })
    }

    /// Keeps the data path running for `d` (so the last ACKs leave before
    /// the process exits).
    pub fn poll_for(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.dp.poll();
        }
    }

    /// Polls until `f` returns Some, or fails after `timeout`.
    pub fn run_until<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut f: impl FnMut(&mut DataPath) -> Option<T>,
    ) -> Result<T> {
        let start = Instant::now();
        loop {
            self.dp.poll();
            if let Some(t) = f(&mut self.dp) {
                return Ok(t);
            }
            if start.elapsed() > timeout {
                bail!("timed out after {:?} waiting for {what}", timeout);
            }
        }
    }

    /// Waits for one completion on `cq`; errors carry the WC status.
    pub fn wait_wc(&mut self, cq: u32, timeout: Duration) -> Result<Wc> {
        let wc = self.run_until(timeout, "a completion", |dp| {
            let mut b = [NO_WC; 1];
            let c = dp.core.cq_mut(cq)?;
            (c.poll(&mut b) == 1).then_some(b[0])
        })?;
        Ok(wc)
    }
}
