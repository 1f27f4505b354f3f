//! Host commands with a time-out, each in its own process group so that a
//! time-out (or drop) stops the command and everything it started.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::{io_err, Result};

/// Sends `sig` to process group `pgid` (errors ignored: it may be gone).
pub(crate) fn kill_group(pgid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), "--", &format!("-{pgid}")])
        .stderr(Stdio::null())
        .status();
}

/// Process groups of the running [`Bounded`] commands, for
/// [`stop_running`] on an interrupt.
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn forget(pgid: u32) {
    if let Ok(mut v) = RUNNING.lock() {
        v.retain(|&p| p != pgid);
    }
}

/// Kills every running [`Bounded`] command's process group: for an
/// interrupt handler, where no destructor will run.
pub fn stop_running() {
    let groups = RUNNING.lock().map(|v| v.clone()).unwrap_or_default();
    for g in groups {
        kill_group(g, "KILL");
    }
}

/// A running host command in its own process group, with its output
/// collected; stopped (SIGTERM to the group, then SIGKILL) on drop.
pub struct Bounded {
    child: Option<Child>,
    out: Option<std::thread::JoinHandle<Vec<u8>>>,
    err: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Bounded {
    pub fn spawn(cmd: &mut Command) -> Result<Bounded> {
        let mut child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io_err(format!("start {:?}", cmd.get_program())))?;
        if let Ok(mut v) = RUNNING.lock() {
            v.push(child.id());
        }
        let drain = |mut r: Box<dyn Read + Send>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = r.read_to_end(&mut v);
                v
            })
        };
        let out = child.stdout.take().map(|o| drain(Box::new(o)));
        let err = child.stderr.take().map(|e| drain(Box::new(e)));
        Ok(Bounded {
            child: Some(child),
            out,
            err,
        })
    }

    /// Has it exited?
    pub fn done(&mut self) -> bool {
        match &mut self.child {
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Waits up to `timeout`; a command still running then is stopped and
    /// its output returned with `timed_out`.
    pub fn wait(mut self, timeout: Duration) -> Result<(Output, bool)> {
        let deadline = Instant::now() + timeout;
        let mut timed_out = false;
        while !self.done() {
            if Instant::now() >= deadline {
                timed_out = true;
                self.stop();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut child = self.child.take().expect("child present until waited");
        let status = child.wait().map_err(io_err("wait for a command"))?;
        forget(child.id());
        let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Ok((
            Output {
                status,
                stdout: join(self.out.take()),
                stderr: join(self.err.take()),
            },
            timed_out,
        ))
    }

    fn stop(&mut self) {
        let Some(c) = &mut self.child else { return };
        if !matches!(c.try_wait(), Ok(None)) {
            return;
        }
        let pgid = c.id();
        kill_group(pgid, "TERM");
        let deadline = Instant::now() + Duration::from_secs(3);
        while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_group(pgid, "KILL");
        let _ = c.wait();
        forget(pgid);
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs `cmd` to completion or for at most `timeout`; see [`Bounded::wait`].
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> Result<(Output, bool)> {
    Bounded::spawn(cmd)?.wait(timeout)
}

/// Runs a setup command that must succeed; its stderr's tail is the error.
pub(crate) fn must(cmd: &mut Command, what: &str) -> Result<Vec<u8>> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("{what}: start {:?}", cmd.get_program())))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        return Err(crate::Error::Command {
            what: what.into(),
            detail: format!(
                "{} ({})",
                tail.into_iter().rev().collect::<Vec<_>>().join(" / "),
                out.status
            ),
        });
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_out_command_and_its_children_are_stopped() {
        // The shell starts a child that would outlive it; both must go.
        let marker = std::env::temp_dir().join(format!("rxevm-proc-{}", std::process::id()));
        let script = format!("(sleep 2; touch {}) & sleep 2", marker.display());
        let t0 = Instant::now();
        let (out, timed_out) = run_bounded(
            Command::new("sh").args(["-c", &script]),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(timed_out);
        assert!(!out.status.success());
        assert!(t0.elapsed() < Duration::from_millis(1500));
        std::thread::sleep(Duration::from_millis(2500).saturating_sub(t0.elapsed()));
        assert!(!marker.exists(), "the background child survived");
    }

    #[test]
    fn output_is_collected() {
        let (out, timed_out) = run_bounded(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert!(!timed_out);
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert_eq!(out.status.code(), Some(3));
    }
}
