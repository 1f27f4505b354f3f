//! Builds the drop-in `libibverbs.so.1`: rdma-ibverbs' staticlib linked by
//! the C compiler with rdma-core's version script and SONAME. (A Rust
//! cdylib cannot do it: rustc's own version script leaves the exports
//! unversioned and without a SONAME.)
//!
//! The perftest binaries also link `librdmacm.so.1`, `libmlx5.so.1` and
//! `libefa.so.1`, and the real libmlx5/libefa demand rdma-core's private
//! symbol version from whichever libibverbs is loaded. So those names are
//! links to the same file: glibc maps one object (it recognises the file),
//! and every version node the binaries ask for is in it.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The sonames that are links to the one library.
pub const ALIASES: [&str; 3] = ["librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"];

fn run(c: &mut Command, what: &str) -> io::Result<()> {
    let out = c.output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Builds the staticlib (`cargo build -p rdma-ibverbs`) in `workspace`,
/// links `target/{debug,release}/ibverbs/libibverbs.so.1` and its aliases,
/// and returns that directory (what `LD_LIBRARY_PATH` wants).
pub fn build(workspace: &Path, release: bool) -> io::Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(workspace)
        .args(["build", "--quiet", "-p", "rdma-ibverbs", "--lib"]);
    if release {
        c.arg("--release");
    }
    run(&mut c, "cargo build -p rdma-ibverbs")?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    let archive = target.join(profile).join("librdma_ibverbs.a");
    let dir = target.join(profile).join("ibverbs");
    std::fs::create_dir_all(&dir)?;
    let so = dir.join("libibverbs.so.1");
    let map = workspace.join("rdma-user/ibverbs/libibverbs.map");
    run(
        Command::new("cc")
            .arg("-shared")
            .arg("-o")
            .arg(&so)
            .arg("-Wl,--whole-archive")
            .arg(&archive)
            .arg("-Wl,--no-whole-archive")
            .arg(format!("-Wl,--version-script={}", map.display()))
            .args(["-Wl,-soname,libibverbs.so.1", "-Wl,--gc-sections"])
            .args(["-lpthread", "-ldl", "-lm", "-lgcc_s"]),
        "cc -shared libibverbs.so.1",
    )?;
    for alias in ALIASES {
        let p = dir.join(alias);
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink("libibverbs.so.1", &p)?;
    }
    Ok(dir)
}
