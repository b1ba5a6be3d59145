//! `sluice new operator NAME`: a new operator crate that builds and passes its tests
//! without an edit — the SDK dependency, the wasm32-wasip2 build, a native unit test, a
//! test of the built component in the sandbox through `sluice test`, fixtures and a
//! README. It depends on the SDK alone, by version (or by path, with `--sdk`), so it
//! builds anywhere in seconds, wherever this binary was built. This module owns the
//! templates (`*.in` beside it, compiled into the binary) and writing them; it knows
//! nothing of jobs.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The files of a new operator crate: path in the crate, template.
const TEMPLATES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("Cargo.toml.in")),
    ("src/lib.rs", include_str!("lib.rs.in")),
    ("tests/sandbox.rs", include_str!("sandbox.rs.in")),
    ("fixtures/input.jsonl", include_str!("input.jsonl.in")),
    ("fixtures/expected.jsonl", include_str!("expected.jsonl.in")),
    ("README.md", include_str!("README.md.in")),
    (".gitignore", "/target\n"),
];

/// The version of the SDK (`sluice-guest`) this binary's host serves, which a new crate
/// depends on: the workspace's version, which the SDK shares.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Writes the operator crate `name` into `dir` (which must not exist), depending on the
/// SDK by [`SDK_VERSION`], or on the SDK crate in the directory `sdk` (a checkout's
/// `guest-sdk`, or an unpacked copy); returns the files written.
pub fn new_operator(name: &str, dir: &Path, sdk: Option<&Path>) -> Result<Vec<PathBuf>> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!("{name:?} is not an operator name: lowercase letters, digits, - and _, starting with a letter");
    }
    let dependency = match sdk {
        None => format!("\"{SDK_VERSION}\""),
        Some(sdk) => {
            let manifest = std::fs::read_to_string(sdk.join("Cargo.toml")).unwrap_or_default();
            if !manifest.lines().any(|line| line.replace(' ', "") == "name=\"sluice-guest\"") {
                bail!("{} holds no SDK crate (a Cargo.toml naming the package sluice-guest)", sdk.display());
            }
            let sdk = std::fs::canonicalize(sdk).with_context(|| format!("resolving {}", sdk.display()))?;
            format!("{{ path = {:?} }}", sdk.display().to_string())
        }
    };
    if dir.exists() {
        bail!("{} exists already; nothing was written", dir.display());
    }
    let file = name.replace('-', "_");
    let type_name: String = name
        .split(['-', '_'])
        .map(|word| word[..word.len().min(1)].to_ascii_uppercase() + &word[word.len().min(1)..])
        .collect();
    let mut written = Vec::new();
    for (path, template) in TEMPLATES {
        let text = template
            .replace("{{name}}", name)
            .replace("{{file}}", &file)
            .replace("{{type}}", &type_name)
            .replace("{{sdk}}", &dependency)
            .replace("{{sdk_version}}", SDK_VERSION);
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name becomes the crate, the file and the type; the SDK is a version, or the
    /// path given, which must hold the SDK; an existing directory or a bad name is
    /// refused.
    #[test]
    fn a_name_becomes_the_crate_the_file_and_the_type() -> Result<()> {
        let scratch = tempfile::tempdir()?;
        let dir = scratch.path().join("click-counter");
        new_operator("click-counter", &dir, None)?;
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))?;
        assert!(manifest.contains(&format!("sluice-guest = \"{SDK_VERSION}\"")), "{manifest}");
        let lib = std::fs::read_to_string(dir.join("src/lib.rs"))?;
        assert!(lib.contains("pub struct ClickCounter;") && lib.contains("export_operator!(ClickCounter);"));
        assert!(std::fs::read_to_string(dir.join("README.md"))?.contains("release/click_counter.wasm"));
        for file in ["Cargo.toml", "README.md", "tests/sandbox.rs"] {
            assert!(!std::fs::read_to_string(dir.join(file))?.contains("{{"), "every placeholder filled: {file}");
        }
        let again = new_operator("click-counter", &dir, None).unwrap_err().to_string();
        assert!(again.contains("exists already"), "{again}");
        let bad = new_operator("Click Counter", &scratch.path().join("x"), None).unwrap_err().to_string();
        assert!(bad.contains("is not an operator name"), "{bad}");
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk");
        let local = scratch.path().join("local");
        new_operator("local", &local, Some(&sdk))?;
        let manifest = std::fs::read_to_string(local.join("Cargo.toml"))?;
        let path = std::fs::canonicalize(&sdk)?.display().to_string();
        assert!(manifest.contains(&format!("sluice-guest = {{ path = {path:?} }}")), "{manifest}");
        let not_sdk = new_operator("x", &scratch.path().join("y"), Some(scratch.path())).unwrap_err().to_string();
        assert!(not_sdk.contains("holds no SDK crate"), "{not_sdk}");
        Ok(())
    }
}
