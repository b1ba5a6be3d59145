//! `sluice new operator`: a new operator crate, written from the scaffold's templates.
//!
//! This module owns only the command's defaults (the crate's directory) and the line
//! saying what to do next; the crate's files, its SDK dependency and the checks of its
//! name are [`sluice::scaffold`]'s.

use anyhow::Result;
use sluice::scaffold::Language;
use std::path::PathBuf;

/// `sluice new operator`
pub fn new_operator(name: &str, dir: Option<PathBuf>, sdk: Option<PathBuf>, language: Language) -> Result<()> {
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    let written = sluice::scaffold::new_operator(name, &dir, sdk.as_deref(), language)?;
    let tools = match language {
        Language::Rust => None,
        Language::Python => Some(format!("componentize-py {}", sluice::scaffold::COMPONENTIZE_PY_VERSION)),
        Language::TypeScript => Some(format!(
            "tsc {} and componentize-js {}",
            sluice::scaffold::TYPESCRIPT_VERSION,
            sluice::scaffold::COMPONENTIZE_JS_VERSION
        )),
    };
    if let Some(tools) = tools {
        eprintln!(
            "wrote {} files into {}; next: cd {} && ./build.sh && ./test.sh (build.sh needs {tools})",
            written.len(),
            dir.display(),
            dir.display(),
        );
        return Ok(());
    }
    if sdk.is_none() {
        eprintln!(
            "note: it depends on sluice-guest {} from crates.io; until that version is published there, write it \
             with --sdk naming a sluice checkout's guest-sdk (or an unpacked `cargo package` of it)",
            sluice::scaffold::SDK_VERSION
        );
    }
    eprintln!(
        "wrote {} files into {}; next: cd {} && cargo build --release --target wasm32-wasip2 && cargo test",
        written.len(),
        dir.display(),
        dir.display()
    );
    Ok(())
}
