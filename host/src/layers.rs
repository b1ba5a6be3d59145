//! Keeps the layers pointing one way: a module may import only modules before it in
//! [`CHAIN`] (see the crate's documentation), and inside a folder the files and
//! subfolders import one another without a circle. Comments are not imports; items of
//! the crate root (such as `lock`) belong to no layer, items of a folder's own
//! `mod.rs` to none of its rooms. Tests (a file's `#[cfg(test)] mod tests`, a
//! `tests.rs`) are not looked at for circles: they may reach across rooms. The binary
//! (`main.rs` and its `cli/`) is no layer: it reaches the library as `sluice::`, after
//! all of it, and its own `crate::` is the binary. A folder's module is its `mod.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules in the order they may import each other; a stage's modules may not
/// import one another.
const CHAIN: &[&[&str]] = &[
    &["record", "backoff", "bandwidth", "log_rate", "objects", "kafka", "probes"],
    &["stats", "config", "checksum", "lines"],
    &["state"],
    &["checkpoint"],
    &["operator"],
    &["sink"],
    &["source"],
    &["worker"],
    &["partitions"],
    &["metrics", "warnings", "test_driver", "replay"],
    &["admin"],
    &["job", "scaffold"],
    &["events"],
];

fn stage(module: &str) -> Option<usize> {
    CHAIN.iter().position(|stage| stage.contains(&module))
}

/// The first name of every path the code (not the comments) of `source` names from
/// `crate::`, `super::` or `self::`, made absolute from `module`: the top-level modules
/// and crate-root items it reaches.
fn imports(source: &str, module: &[String]) -> Vec<String> {
    paths(&code(source), module).into_iter().filter_map(|path| path.into_iter().next()).collect()
}

/// The `.rs` files under `path` (a file or a directory).
fn files(path: &Path) -> Vec<PathBuf> {
    if !path.is_dir() {
        return vec![path.to_path_buf()];
    }
    let entries = std::fs::read_dir(path).expect("reading src");
    entries.flat_map(|entry| files(&entry.expect("reading src").path())).collect()
}

/// Where a file's inline test module begins.
const TEST_MODULE: &str = "#[cfg(test)]\nmod tests {";

/// The code of `source`, its comments left out, as one line.
fn code(source: &str) -> String {
    let lines = source.lines().map(str::trim).filter(|line| !line.starts_with("//"));
    lines.map(|line| line.split(" // ").next().unwrap_or(line)).collect::<Vec<_>>().join(" ")
}

/// Every path `code` names from `crate::`, `super::` or `self::`, made absolute from
/// `module` (the path of the module the code is in), down to the first name inside a
/// `{…}` group.
fn paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let is_name = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (at, _) in code.match_indices("::") {
        // The first `::` of a path: its start is the name just before it.
        let start = code[..at].rfind(|c: char| !is_name(c)).map_or(0, |i| i + 1);
        if code[..start].ends_with("::") {
            continue;
        }
        let mut path: Vec<String> = match &code[start..at] {
            "crate" => Vec::new(),
            // A folder's `mod.rs` is the folder's module: `super` from `a/mod.rs` is
            // `a`'s parent, as from `a.rs`.
            "self" => module.to_vec(),
            "super" => module[..module.len() - 1].to_vec(),
            _ => continue,
        };
        let mut rest = &code[at + 2..];
        loop {
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(group.len())];
                for member in inner.split(',').map(|m| m.trim().split("::").next().unwrap_or("")) {
                    if !member.is_empty() {
                        found.push([path.clone(), vec![member.to_string()]].concat());
                    }
                }
                break;
            }
            let name: String = rest.chars().take_while(|&c| is_name(c)).collect();
            if name == "super" {
                path.pop();
            } else if !name.is_empty() {
                path.push(name.clone());
            }
            match rest[name.len()..].strip_prefix("::") {
                Some(next) if !name.is_empty() => rest = next,
                _ => {
                    found.push(path);
                    break;
                }
            }
        }
    }
    found
}

#[test]
fn layers_import_only_earlier_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut violations = Vec::new();
    for (file, module) in modules(&src) {
        let top = &module[0];
        let own = stage(top).unwrap_or_else(|| panic!("module {top} is missing from CHAIN in layers.rs"));
        let source = std::fs::read_to_string(&file).expect("reading a source file");
        for imported in imports(&source, &module) {
            if stage(&imported).is_some_and(|theirs| theirs >= own) && imported != *top {
                violations.push(format!("{} imports crate::{imported}", file.display()));
            }
        }
    }
    assert!(violations.is_empty(), "imports against the layer chain:\n{}", violations.join("\n"));
}

#[test]
fn the_check_sees_plain_and_grouped_imports_but_not_comments() {
    let source = "use crate::worker::Stop;\nuse crate::{state, sink::Sink};\n// see crate::job\nlet x = crate::lock(&m); // crate::admin\n";
    assert_eq!(imports(source, &["job".to_string()]), ["worker", "state", "sink", "lock"]);
}

/// The module path of each library file under `src` (`a/mod.rs` and `a.rs`: `a`),
/// the binary's files left out.
fn modules(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
    let mut modules = Vec::new();
    for file in files(src).into_iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let relative = file.strip_prefix(src).expect("under src").with_extension("");
        let mut module: Vec<String> = relative.iter().map(|c| c.to_string_lossy().into_owned()).collect();
        let binary =
            module[0] == "cli" || (module.len() == 1 && ["lib", "main", "layers"].contains(&module[0].as_str()));
        if binary {
            continue;
        }
        if module.last().is_some_and(|name| name == "mod") {
            module.pop();
        }
        modules.push((file, module));
    }
    modules
}

/// A circle in `imports` (room → the rooms it imports), if there is one, as the rooms
/// along it, the first again at the end.
fn circle(imports: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit<'a>(
        room: &'a str,
        imports: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|&r| r == room) {
            return Some(path[at..].iter().chain([&room]).map(|r| r.to_string()).collect());
        }
        if !done.insert(room) {
            return None;
        }
        path.push(room);
        for next in imports.get(room).into_iter().flatten() {
            if let Some(found) = visit(next, imports, path, done) {
                return Some(found);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    imports.keys().find_map(|room| visit(room, imports, &mut Vec::new(), &mut done))
}

#[test]
fn no_folder_has_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // A test module of a file of its own (`tests.rs`) is left out, as an inline one is.
    let modules: Vec<_> = modules(&src).into_iter().filter(|(_, m)| m.last().is_some_and(|n| n != "tests")).collect();
    let known: BTreeSet<&[String]> = modules.iter().map(|(_, m)| m.as_slice()).collect();
    // Per folder, which of its rooms (files and subfolders) imports which.
    let mut folders: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, module) in &modules {
        let source = std::fs::read_to_string(file).expect("reading a source file");
        let source = source.split(TEST_MODULE).next().unwrap_or(&source);
        for path in paths(&code(source), module) {
            let shared = module.iter().zip(&path).take_while(|(a, b)| a == b).count();
            // Between top-level modules the chain decides; a folder's `mod.rs` and
            // its own items are in none of its rooms.
            if shared == 0 || module.len() <= shared || path.len() <= shared || !known.contains(&path[..=shared]) {
                continue;
            }
            let rooms = folders.entry(module[..shared].to_vec()).or_default();
            rooms.entry(module[shared].clone()).or_default().insert(path[shared].clone());
        }
    }
    let circles: Vec<String> = folders
        .iter()
        .filter_map(|(folder, rooms)| Some(format!("{}: {}", folder.join("/"), circle(rooms)?.join(" → "))))
        .collect();
    assert!(circles.is_empty(), "rooms of a folder importing one another in a circle:\n{}", circles.join("\n"));
}

#[test]
fn paths_are_made_absolute_from_the_module_they_are_named_in() {
    let module = ["partitions".to_string(), "lifecycle".to_string()];
    let code = code(
        "use super::events::STOPPED;\nuse super::{start::Begun,\n occupancy};\n// super::router\nlet x = crate::worker::queue::bounded(1);\nself::tests::run();\n",
    );
    let names: Vec<String> = paths(&code, &module).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        names,
        [
            "partitions::events::STOPPED",
            "partitions::start",
            "partitions::occupancy",
            "worker::queue::bounded",
            "partitions::lifecycle::tests::run"
        ]
    );
}

#[test]
fn a_circle_is_found_and_named_with_its_rooms() {
    let imports = |edges: &[(&str, &str)]| {
        let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            imports.entry(from.to_string()).or_default().insert(to.to_string());
        }
        imports
    };
    assert_eq!(circle(&imports(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    let found = circle(&imports(&[("lifecycle", "start"), ("start", "occupancy"), ("occupancy", "lifecycle")]));
    assert_eq!(found.expect("a circle").join(" → "), "lifecycle → start → occupancy → lifecycle");
}

/// One module style for folders: a folder's module is its `mod.rs`, never an `a.rs`
/// beside `a/`.
#[test]
fn every_folder_module_is_its_mod_rs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let beside: Vec<String> = files(&src)
        .into_iter()
        .filter(|file| file.extension().is_some_and(|e| e == "rs") && file.with_extension("").is_dir())
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        beside.is_empty(),
        "module files beside their folders (move each to its folder's mod.rs):\n{}",
        beside.join("\n")
    );
}
