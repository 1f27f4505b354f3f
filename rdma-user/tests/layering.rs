//! The crate's layers import only downwards (see the table in `src/lib.rs`):
//! no import cycles, and nothing outside `tools` imports `tools`.

use std::path::Path;

/// Module -> rank; a module may import modules of a lower rank (and itself).
/// `control` and `verbs` share a rank and must not import each other.
const LAYERS: [(&str, u32); 10] = [
    ("rng", 0),
    ("wire", 1),
    ("memory", 2),
    ("transport", 3),
    ("cm", 3),
    ("io", 4),
    ("device", 5),
    ("control", 6),
    ("verbs", 6),
    ("tools", 7),
];

fn rank(m: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _)| *n == m).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `crate::NAME` in a file (imports and paths alike).
fn crate_refs(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        // `rdma_user::crate` cannot occur; skip `$crate::` in macros.
        if i > 0 && text.as_bytes()[i - 1] == b'$' {
            continue;
        }
        let rest = &text[i + 7..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            v.push(name);
        }
    }
    v
}

#[test]
fn layers_import_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = top.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "bin" {
            continue;
        }
        let own = rank(&module).unwrap_or_else(|| panic!("{module} has no layer in LAYERS"));
        let text = std::fs::read_to_string(f).unwrap();
        for r in crate_refs(&text) {
            checked += 1;
            if r == module {
                continue;
            }
            let Some(theirs) = rank(&r) else {
                violations.push(format!("{}: crate::{r} is not a layer", rel.display()));
                continue;
            };
            if theirs >= own {
                violations.push(format!(
                    "{}: {module} (rank {own}) imports {r} (rank {theirs})",
                    rel.display()
                ));
            }
        }
    }
    assert!(checked > 50, "only {checked} crate:: paths found");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
