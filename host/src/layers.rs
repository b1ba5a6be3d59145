//! Keeps the layers pointing one way: a module may import only modules before it in
//! [`CHAIN`] (see the crate's documentation). Comments are not imports; `super::`
//! stays inside a module; items of the crate root (such as `lock`) belong to no layer.
//! The binary (`main.rs` and its `cli/`) is no layer: it reaches the library as
//! `sluice::`, after all of it, and its own `crate::` is the binary.

use std::path::{Path, PathBuf};

/// The modules in the order they may import each other; a stage's modules may not
/// import one another.
const CHAIN: &[&[&str]] = &[
    &["record", "backoff", "bandwidth", "log_rate", "objects", "kafka"],
    &["stats", "config", "checksum", "lines"],
    &["state"],
    &["checkpoint"],
    &["operator"],
    &["sink"],
    &["source"],
    &["worker"],
    &["metrics", "warnings", "test_driver", "trial"],
    &["admin"],
    &["job", "scaffold"],
    &["events"],
];

fn stage(module: &str) -> Option<usize> {
    CHAIN.iter().position(|stage| stage.contains(&module))
}

/// Every `crate::<module>` named in the code (not the comments) of `source`.
fn imports(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in source.lines().map(str::trim).filter(|line| !line.starts_with("//")) {
        let code = line.split(" // ").next().unwrap_or(line);
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            // `crate::{a, b}` names several.
            if name.is_empty() && rest.starts_with('{') {
                let inner = &rest[1..rest.find('}').unwrap_or(rest.len())];
                found.extend(inner.split(',').map(|n| n.trim().split("::").next().unwrap_or("").to_string()));
            } else {
                found.push(name);
            }
        }
    }
    found
}

/// The `.rs` files under `path` (a file or a directory).
fn files(path: &Path) -> Vec<PathBuf> {
    if !path.is_dir() {
        return vec![path.to_path_buf()];
    }
    let entries = std::fs::read_dir(path).expect("reading src");
    entries.flat_map(|entry| files(&entry.expect("reading src").path())).collect()
}

#[test]
fn layers_import_only_earlier_layers() {
    let mut violations = Vec::new();
    for entry in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("src")).expect("reading src") {
        let path = entry.expect("reading src").path();
        let module = path.file_stem().and_then(|s| s.to_str()).expect("a UTF-8 file name").to_string();
        if ["lib", "main", "cli", "layers"].contains(&module.as_str()) {
            continue;
        }
        let own = stage(&module).unwrap_or_else(|| panic!("module {module} is missing from CHAIN in layers.rs"));
        for file in files(&path).iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
            let source = std::fs::read_to_string(file).expect("reading a source file");
            for imported in imports(&source) {
                if stage(&imported).is_some_and(|theirs| theirs >= own) && imported != module {
                    violations.push(format!("{} imports crate::{imported}", file.display()));
                }
            }
        }
    }
    assert!(violations.is_empty(), "imports against the layer chain:\n{}", violations.join("\n"));
}

#[test]
fn the_check_sees_plain_and_grouped_imports_but_not_comments() {
    let source = "use crate::worker::Stop;\nuse crate::{state, sink::Sink};\n// see crate::job\nlet x = crate::lock(&m); // crate::admin\n";
    assert_eq!(imports(source), ["worker", "state", "sink", "lock"]);
}
