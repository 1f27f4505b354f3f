//! The initramfs: a tree of guest paths written as a "newc" cpio archive
//! (the format the kernel unpacks), byte for byte the same for the same
//! tree: entries sorted, owner root, times zero.

use std::collections::BTreeMap;
use std::io::{self, Write};

/// One guest file system entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Node {
    Dir,
    File { data: Vec<u8>, mode: u32 },
    Symlink(String),
}

/// A guest tree keyed by absolute path ("/usr/bin/ip"); parent directories
/// are added as needed.
#[derive(Default)]
pub(crate) struct Tree {
    nodes: BTreeMap<String, Node>,
}

impl Tree {
    fn add_parents(&mut self, path: &str) {
        let mut p = path;
        while let Some((parent, _)) = p.rsplit_once('/') {
            if parent.is_empty() {
                break;
            }
            self.nodes.entry(parent.to_string()).or_insert(Node::Dir);
            p = parent;
        }
    }

    pub(crate) fn dir(&mut self, path: &str) {
        self.add_parents(path);
        self.nodes.insert(path.into(), Node::Dir);
    }

    /// Adds a file; an existing one at that path is kept (the first source
    /// of a library wins, as the dynamic linker's search would).
    pub(crate) fn file(&mut self, path: &str, data: Vec<u8>, mode: u32) {
        self.add_parents(path);
        self.nodes
            .entry(path.into())
            .or_insert(Node::File { data, mode });
    }

    pub(crate) fn symlink(&mut self, path: &str, target: &str) {
        self.add_parents(path);
        self.nodes
            .entry(path.into())
            .or_insert(Node::Symlink(target.into()));
    }

    pub(crate) fn contains(&self, path: &str) -> bool {
        self.nodes.contains_key(path)
    }

    /// Writes the archive.
    pub(crate) fn write(&self, w: &mut impl Write) -> io::Result<()> {
        for (ino, (path, node)) in (1u32..).zip(&self.nodes) {
            let name = path.trim_start_matches('/');
            let (mode, data): (u32, &[u8]) = match node {
                Node::Dir => (0o040755, &[]),
                Node::File { data, mode } => (0o100000 | mode, data),
                Node::Symlink(t) => (0o120777, t.as_bytes()),
            };
            let nlink = if matches!(node, Node::Dir) { 2 } else { 1 };
            entry(w, ino, mode, nlink, name, data)?;
        }
        entry(w, 0, 0, 1, "TRAILER!!!", &[])
    }
}

fn pad4(w: &mut impl Write, len: usize) -> io::Result<()> {
    w.write_all(&[0u8; 3][..(4 - len % 4) % 4])
}

fn entry(
    w: &mut impl Write,
    ino: u32,
    mode: u32,
    nlink: u32,
    name: &str,
    data: &[u8],
) -> io::Result<()> {
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime
        data.len() as u32,
        0, // devmajor
        0, // devminor
        0, // rdevmajor
        0, // rdevminor
        name.len() as u32 + 1,
        0, // check
    ];
    let mut h = String::from("070701");
    for f in fields {
        h.push_str(&format!("{f:08X}"));
    }
    w.write_all(h.as_bytes())?;
    w.write_all(name.as_bytes())?;
    w.write_all(&[0])?;
    pad4(w, h.len() + name.len() + 1)?;
    w.write_all(data)?;
    pad4(w, data.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newc_layout_of_one_file() {
        let mut t = Tree::default();
        t.file("/a", b"hi".to_vec(), 0o755);
        let mut v = Vec::new();
        t.write(&mut v).unwrap();
        // Header: magic, ino 1, mode 0100755, uid, gid, nlink 1, mtime,
        // size 2, four device numbers, namesize 2 ("a\0"), check.
        let want_header = "07070100000001000081ED0000000000000000000000010000000000000002000000000000000000000000000000000000000200000000";
        assert_eq!(&v[..110], want_header.as_bytes());
        // 110 + 2 name bytes = 112, already aligned; data "hi" + 2 pad.
        assert_eq!(&v[110..112], b"a\0");
        assert_eq!(&v[112..116], b"hi\0\0");
        assert_eq!(&v[116..122], b"070701");
        assert!(v.ends_with(b"TRAILER!!!\0\0\0\0"));
        assert_eq!(v.len() % 4, 0);
    }

    #[test]
    fn parents_are_added_and_output_is_stable() {
        let build = || {
            let mut t = Tree::default();
            t.symlink("/usr/bin/sh", "busybox");
            t.file("/usr/bin/busybox", vec![1, 2, 3], 0o755);
            t.file("/usr/bin/busybox", vec![9], 0o755);
            let mut v = Vec::new();
            t.write(&mut v).unwrap();
            (t.contains("/usr"), t.contains("/usr/bin"), v)
        };
        let (usr, bin, a) = build();
        assert!(usr && bin);
        assert_eq!(a, build().2);
        // The first source of a path wins.
        assert!(a.windows(3).any(|w| w == [1, 2, 3]));
    }
}
