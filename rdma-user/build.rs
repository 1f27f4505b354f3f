//! Builds the XDP program (`rdma-ebpf`) for bpfel-unknown-none with nightly
//! and bpf-linker, via aya-build; the object is embedded in the binary.

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest)
        .parent()
        .ok_or_else(|| anyhow!("rdma-user has no parent directory"))?
        .join("rdma-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    // The XDP program embeds rdma-common's opcode table and header
    // layouts; aya-build watches only the eBPF crate itself, so a change
    // there would otherwise leave a stale object in the binary.
    let common = std::path::Path::new(&manifest)
        .parent()
        .ok_or_else(|| anyhow!("rdma-user has no parent directory"))?
        .join("rdma-common");
    println!("cargo:rerun-if-changed={}", common.join("src").display());
    println!(
        "cargo:rerun-if-changed={}",
        common.join("Cargo.toml").display()
    );
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "rdma-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
