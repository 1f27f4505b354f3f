//! A client of the QEMU guest agent (qemu-ga, from Debian's
//! qemu-guest-agent) on the VM's virtio-serial port: runs commands in the
//! guest with a time-out and returns their output and exit status.
//!
//! One connection per request, opened with `guest-sync-delimited`: the
//! agent's 0xFF marker tells where its answer to us starts, so a stale
//! answer left by an interrupted earlier client is skipped.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{json, Value};

use crate::{Error, Result};

/// A finished guest command.
#[derive(Debug, Clone)]
pub struct GuestOutput {
    pub stdout: String,
    pub stderr: String,
    /// The exit code; 128+N for signal N.
    pub code: i64,
    /// It ran past its time-out and its process group was killed.
    pub timed_out: bool,
}

impl GuestOutput {
    pub fn success(&self) -> bool {
        self.code == 0 && !self.timed_out
    }
}

/// The agent of one VM, by its socket.
#[derive(Clone, Debug)]
pub struct Agent {
    socket: PathBuf,
}

/// Finds our sync answer in what the agent sent: the line after the last
/// 0xFF that parses as `{"return": id}`. Returns the bytes after it.
fn after_sync(buf: &[u8], id: u64) -> Option<usize> {
    let mut start = 0;
    while let Some(i) = buf[start..].iter().position(|&b| b == 0xff) {
        let from = start + i + 1;
        let nl = from + buf[from..].iter().position(|&b| b == b'\n')?;
        if let Ok(v) = serde_json::from_slice::<Value>(&buf[from..nl]) {
            if v["return"].as_u64() == Some(id) {
                return Some(nl + 1);
            }
        }
        start = nl + 1;
    }
    None
}

impl Agent {
    pub fn new(socket: &Path) -> Agent {
        Agent {
            socket: socket.to_path_buf(),
        }
    }

    /// One request, its `return` value.
    pub fn call(&self, execute: &str, arguments: Value, timeout: Duration) -> Result<Value> {
        let guest = |s: String| Error::Guest(format!("guest agent {}: {s}", self.socket.display()));
        let mut s = UnixStream::connect(&self.socket).map_err(|e| guest(e.to_string()))?;
        s.set_read_timeout(Some(timeout))
            .map_err(|e| guest(e.to_string()))?;
        // Unique enough to tell our answer from a stale one; below 2^53.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let id = (u64::from(std::process::id()) << 30) ^ u64::from(nanos);
        let mut msg = vec![0xff];
        msg.extend(
            json!({"execute": "guest-sync-delimited", "arguments": {"id": id}})
                .to_string()
                .bytes(),
        );
        msg.push(b'\n');
        s.write_all(&msg).map_err(|e| guest(e.to_string()))?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 65536];
        let rest = loop {
            let n = s
                .read(&mut chunk)
                .map_err(|e| guest(format!("sync: {e}")))?;
            if n == 0 {
                return Err(guest("closed during sync".into()));
            }
            buf.extend_from_slice(&chunk[..n]);
            if let Some(at) = after_sync(&buf, id) {
                break buf.split_off(at);
            }
        };
        let mut req = json!({ "execute": execute });
        if !arguments.is_null() {
            req["arguments"] = arguments;
        }
        s.write_all(format!("{req}\n").as_bytes())
            .map_err(|e| guest(e.to_string()))?;
        let mut buf = rest;
        loop {
            while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).filter(|&b| b != 0xff).collect();
                let Ok(v) = serde_json::from_slice::<Value>(&line) else {
                    continue;
                };
                if let Some(e) = v.get("error") {
                    return Err(guest(format!("{execute}: {}", e["desc"])));
                }
                if let Some(r) = v.get("return") {
                    return Ok(r.clone());
                }
            }
            let n = s
                .read(&mut chunk)
                .map_err(|e| guest(format!("{execute}: {e}")))?;
            if n == 0 {
                return Err(guest(format!("closed during {execute}")));
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Answers within `within`?
    pub fn ping(&self, within: Duration) -> bool {
        self.call("guest-ping", Value::Null, within).is_ok()
    }

    /// Writes `bytes` to `path` in the guest (created or truncated) with
    /// the agent's file calls, then gives it `mode`: how a program built on
    /// the host reaches the RAM-disk guest. The guest's libraries are the
    /// host's (the image copies them), so a host binary runs there.
    pub fn put_file(&self, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
        let t = Duration::from_secs(30);
        let h = self.call("guest-file-open", json!({"path": path, "mode": "w"}), t)?;
        let handle = h
            .as_i64()
            .ok_or_else(|| Error::Guest(format!("guest-file-open {path} answered {h}")))?;
        // qemu-ga reads a request line of at most a few MB: 48 KiB chunks.
        let written = bytes.chunks(48 << 10).try_for_each(|c| {
            let b64 = base64::engine::general_purpose::STANDARD.encode(c);
            self.call(
                "guest-file-write",
                json!({"handle": handle, "buf-b64": b64}),
                t,
            )
            .map(drop)
        });
        let closed = self.call("guest-file-close", json!({ "handle": handle }), t);
        written?;
        closed?;
        let out = self.exec(&format!("chmod {mode:o} {path}"), t)?;
        if !out.success() {
            return Err(Error::Guest(format!("chmod {path}: {}", out.stderr.trim())));
        }
        Ok(())
    }

    /// Starts `argv` in the guest; returns its guest PID.
    fn start(&self, argv: &[&str], capture: bool) -> Result<u64> {
        let r = self.call(
            "guest-exec",
            json!({"path": argv[0], "arg": &argv[1..], "capture-output": capture}),
            Duration::from_secs(30),
        )?;
        r["pid"]
            .as_u64()
            .ok_or_else(|| Error::Guest(format!("guest-exec answered {r}")))
    }

    /// Runs `cmd` with `/bin/sh -c` in a session of its own in the guest;
    /// after `timeout` its whole process group is killed (TERM, then KILL).
    pub fn exec(&self, cmd: &str, timeout: Duration) -> Result<GuestOutput> {
        let pid = self.start(&["/usr/bin/setsid", "/bin/sh", "-c", cmd], true)?;
        let t0 = Instant::now();
        let mut killed = false;
        let mut delay = Duration::from_millis(10);
        loop {
            let st = self.call(
                "guest-exec-status",
                json!({ "pid": pid }),
                Duration::from_secs(30),
            )?;
            if st["exited"].as_bool() == Some(true) {
                let b64 = |k: &str| {
                    let s = st[k].as_str().unwrap_or("");
                    let v = base64::engine::general_purpose::STANDARD
                        .decode(s)
                        .unwrap_or_default();
                    String::from_utf8_lossy(&v).into_owned()
                };
                let code = match (st["exitcode"].as_i64(), st["signal"].as_i64()) {
                    (_, Some(sig)) => 128 + sig,
                    (Some(c), None) => c,
                    (None, None) => -1,
                };
                return Ok(GuestOutput {
                    stdout: b64("out-data"),
                    stderr: b64("err-data"),
                    code,
                    timed_out: killed,
                });
            }
            if !killed && t0.elapsed() > timeout {
                // setsid made the command's PID its process group.
                self.start(
                    &[
                        "/bin/sh",
                        "-c",
                        &format!("kill -TERM -{pid}; sleep 2; kill -KILL -{pid}"),
                    ],
                    false,
                )?;
                killed = true;
            }
            if killed && t0.elapsed() > timeout + Duration::from_secs(20) {
                return Err(Error::Guest(format!(
                    "guest command did not end after being killed: {cmd}"
                )));
            }
            std::thread::sleep(delay);
            delay = (delay * 3 / 2).min(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sync_answer_is_found_after_stale_output() {
        let mut buf = b"{\"return\": {}}\n".to_vec();
        buf.extend(b"\xff{\"return\": 7}\n");
        buf.extend(b"\xff{\"return\": 42}\n{\"return\":");
        let at = after_sync(&buf, 42).unwrap();
        assert_eq!(&buf[at..], b"{\"return\":");
        assert_eq!(after_sync(&buf, 43), None);
        // Not yet complete.
        assert_eq!(after_sync(b"\xff{\"return\": 42}", 42), None);
    }
}
