//! The crate's layers import only downwards (see the table in `src/lib.rs`):
//! no import cycles, and nothing outside `tools` imports `tools`. The same
//! holds for the drop-in libibverbs (`ibverbs/src`, its table in
//! `ibverbs/src/lib.rs`).

use std::path::{Path, PathBuf};

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

/// The drop-in libibverbs' modules, as its `src/lib.rs` lists them: a
/// module may import modules of a lower rank only (modules of one rank do
/// not import each other). `lib` stands for the helpers `lib.rs` defines
/// (`guard`, `set_errno`, ...); `rdmacm` is one module (its submodules
/// import each other through `super`).
const IBVERBS_LAYERS: [(&str, u32); 15] = [
    ("ffi", 0),
    ("lib", 0),
    ("absent", 1),
    ("port", 1),
    ("objects", 2),
    ("pd", 3),
    ("cq", 3),
    ("srq", 3),
    ("ah", 3),
    ("post", 3),
    ("events", 3),
    ("wr", 4),
    ("qp", 5),
    ("device", 6),
    ("rdmacm", 7),
];

fn rank_in(layers: &[(&str, u32)], m: &str) -> Option<u32> {
    layers.iter().find(|(n, _)| *n == m).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// An identifier at the start of `s`.
fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// Every `crate::NAME` in a file (imports and paths alike), and each first
/// name of a group, `crate::{NAME, NAME::x, ...}`.
fn crate_refs(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        // `rdma_user::crate` cannot occur; skip `$crate::` in macros.
        if i > 0 && text.as_bytes()[i - 1] == b'$' {
            continue;
        }
        let rest = &text[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            // Names at the group's top level (nested groups belong to
            // the name before them).
            let mut depth = 0;
            let mut at_name = true;
            for (k, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_name = true,
                    c if at_name && !c.is_whitespace() => {
                        at_name = false;
                        let name = ident(&group[k..]);
                        if !name.is_empty() && name != "self" {
                            v.push(name);
                        }
                    }
                    _ => {}
                }
            }
            continue;
        }
        let name = ident(rest);
        if !name.is_empty() {
            v.push(name);
        }
    }
    v
}

/// The layer violations of the crate at `src` (each file's top module
/// against `layers`; names in `lib_items` are items of `lib.rs`, rank
/// `lib`), and how many `crate::` paths were checked.
fn violations(src: &Path, layers: &[(&str, u32)], lib_items: &[String]) -> (Vec<String>, usize) {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut violations = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(src).unwrap();
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
        let own = rank_in(layers, &module)
            .unwrap_or_else(|| panic!("{module} has no layer in the table"));
        let text = std::fs::read_to_string(f).unwrap();
        for r in crate_refs(&text) {
            checked += 1;
            if r == module {
                continue;
            }
            let layer = if lib_items.contains(&r) { "lib" } else { &r };
            let Some(theirs) = rank_in(layers, layer) else {
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
    (violations, checked)
}

#[test]
fn layers_import_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (violations, checked) = violations(&src, &LAYERS, &[]);
    assert!(checked > 50, "only {checked} crate:: paths found");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// The functions, constants and statics `lib.rs` defines at its top level.
fn lib_items(lib: &str) -> Vec<String> {
    let mut items = Vec::new();
    for line in lib.lines() {
        let l = line
            .trim_start_matches("pub(crate) ")
            .trim_start_matches("pub ");
        for kw in ["fn ", "const ", "static "] {
            if let Some(rest) = l.strip_prefix(kw) {
                let name = ident(rest);
                if !name.is_empty() {
                    items.push(name);
                }
            }
        }
    }
    items
}

#[test]
fn ibverbs_layers_import_only_downwards() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("ibverbs/src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let items = lib_items(&lib);
    assert!(
        items.iter().any(|i| i == "guard"),
        "lib.rs items: {items:?}"
    );
    let (violations, checked) = violations(&src, &IBVERBS_LAYERS, &items);
    assert!(checked > 50, "only {checked} crate:: paths found");
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// The table in `ibverbs/src/lib.rs`'s docs (`//! | RANK | `a`, `b` | ...`)
/// is the one checked here.
#[test]
fn ibverbs_layer_table_is_documented() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ibverbs/src/lib.rs"))
            .unwrap();
    let mut documented = Vec::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! | ") else {
            continue;
        };
        let mut cols = row.split(" | ");
        let (Some(rank), Some(modules)) = (cols.next(), cols.next()) else {
            continue;
        };
        let Ok(rank) = rank.trim().parse::<u32>() else {
            continue;
        };
        for m in modules.split('`').skip(1).step_by(2) {
            documented.push((m.to_string(), rank));
        }
    }
    let mut checked: Vec<(String, u32)> = IBVERBS_LAYERS
        .iter()
        .filter(|(m, _)| *m != "lib")
        .map(|(m, r)| (m.to_string(), *r))
        .collect();
    documented.sort();
    checked.sort();
    assert_eq!(documented, checked);
}

#[test]
fn crate_refs_reads_paths_and_groups() {
    let text =
        "use crate::a::X;\nuse crate::{b, c::{D, E}, self};\nlet x = crate::f(1);\n$crate::g!();";
    assert_eq!(crate_refs(text), ["a", "b", "c", "f"]);
}
