//! `sluice new operator NAME`: a new operator crate that builds and passes its tests
//! without an edit — the SDK dependency, the wasm32-wasip2 build, a native unit test,
//! a test of the built component through the `sluice-test` kit, `sluice test` fixtures
//! and a README. This module owns the templates (`scaffold/*.in`, compiled into the
//! binary) and writing them; it knows nothing of jobs.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The files of a new operator crate: path in the crate, template.
const TEMPLATES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("scaffold/Cargo.toml.in")),
    ("src/lib.rs", include_str!("scaffold/lib.rs.in")),
    ("tests/sandbox.rs", include_str!("scaffold/sandbox.rs.in")),
    ("fixtures/input.jsonl", include_str!("scaffold/input.jsonl.in")),
    ("fixtures/expected.jsonl", include_str!("scaffold/expected.jsonl.in")),
    ("README.md", include_str!("scaffold/README.md.in")),
    (".gitignore", "/target\n"),
    // The versions sluice is built and tested with.
    ("Cargo.lock", include_str!("../../Cargo.lock")),
];

/// The sluice source tree this binary was built from, which holds the SDK and the kit
/// a new crate depends on.
pub fn built_from() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap_or(Path::new(".")).to_path_buf()
}

/// Writes the operator crate `name` into `dir` (which must not exist), depending on the
/// SDK and the kit in the sluice source tree `sluice`; returns the files written.
pub fn new_operator(name: &str, dir: &Path, sluice: &Path) -> Result<Vec<PathBuf>> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!("{name:?} is not an operator name: lowercase letters, digits, - and _, starting with a letter");
    }
    for part in ["guest-sdk", "test-kit"] {
        if !sluice.join(part).join("Cargo.toml").exists() {
            bail!(
                "{} holds no sluice source tree ({part}/Cargo.toml is missing): pass --sluice with a clone of the \
                 sluice repository",
                sluice.display()
            );
        }
    }
    if dir.exists() {
        bail!("{} exists already; nothing was written", dir.display());
    }
    let sluice = std::fs::canonicalize(sluice).with_context(|| format!("resolving {}", sluice.display()))?;
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
            .replace("{{sluice}}", &sluice.display().to_string());
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

    #[test]
    fn a_name_becomes_the_crate_the_file_and_the_type() -> Result<()> {
        let scratch = tempfile::tempdir()?;
        let dir = scratch.path().join("click-counter");
        new_operator("click-counter", &dir, &built_from())?;
        let lib = std::fs::read_to_string(dir.join("src/lib.rs"))?;
        assert!(lib.contains("pub struct ClickCounter;") && lib.contains("export_operator!(ClickCounter);"));
        assert!(std::fs::read_to_string(dir.join("README.md"))?.contains("release/click_counter.wasm"));
        assert!(!std::fs::read_to_string(dir.join("Cargo.toml"))?.contains("{{"), "every placeholder filled");
        let again = new_operator("click-counter", &dir, &built_from()).unwrap_err().to_string();
        assert!(again.contains("exists already"), "{again}");
        let bad = new_operator("Click Counter", &scratch.path().join("x"), &built_from()).unwrap_err().to_string();
        assert!(bad.contains("is not an operator name"), "{bad}");
        Ok(())
    }
}
