//! `sluice new operator NAME`: a new operator that builds and passes its tests without
//! an edit. In Rust, a crate — the SDK dependency, the wasm32-wasip2 build, a native
//! unit test, a test of the built component in the sandbox through `sluice test`,
//! fixtures and a README; it depends on the SDK alone, by version (or by path, with
//! `--sdk`), so it builds anywhere in seconds, wherever this binary was built. In
//! Python (`--lang python`), a project — the app, a copy of the Python SDK and of the
//! WIT world this binary serves, a build script (componentize-py), a test script
//! (`sluice test` over the same fixtures) and a README; it needs nothing but
//! componentize-py. In TypeScript (`--lang typescript`), the same with the TypeScript SDK,
//! a tsconfig.json and a build script (tsc, then componentize-js). This module owns the templates (`*.in` beside it, and the SDK and
//! world, compiled into the binary) and writing them; it knows nothing of jobs.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// The language a new operator is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// A crate over the Rust SDK, `sluice-guest`.
    Rust,
    /// A project over the Python SDK, built by componentize-py.
    Python,
    /// A project over the TypeScript SDK, compiled by tsc and built by componentize-js.
    TypeScript,
}

/// The files of a new operator crate: path in the crate, template.
const RUST_TEMPLATES: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("Cargo.toml.in")),
    ("src/lib.rs", include_str!("lib.rs.in")),
    ("tests/sandbox.rs", include_str!("sandbox.rs.in")),
    ("fixtures/input.jsonl", include_str!("input.jsonl.in")),
    ("fixtures/expected.jsonl", include_str!("expected.jsonl.in")),
    ("README.md", include_str!("README.md.in")),
    (".gitignore", "/target\n"),
];

/// The files of a new Python operator: path in the project, template. The SDK and the
/// world are this binary's, verbatim.
const PYTHON_TEMPLATES: &[(&str, &str)] = &[
    ("app.py", include_str!("python/app.py.in")),
    ("build.sh", include_str!("python/build.sh.in")),
    ("test.sh", include_str!("test.sh.in")),
    ("sluice_operator/__init__.py", include_str!("../../../guest-sdk-python/sluice_operator/__init__.py")),
    ("sluice_operator/encoding.py", include_str!("../../../guest-sdk-python/sluice_operator/encoding.py")),
    ("sluice_operator/window.py", include_str!("../../../guest-sdk-python/sluice_operator/window.py")),
    ("wit/operator.wit", include_str!("../../../wit/operator.wit")),
    ("fixtures/input.jsonl", include_str!("input.jsonl.in")),
    ("fixtures/expected.jsonl", include_str!("expected.jsonl.in")),
    ("README.md", include_str!("python/README.md.in")),
    (".gitignore", "*.wasm\n__pycache__/\n"),
];

/// The files of a new TypeScript operator: path in the project, template. The SDK and
/// the world are this binary's, verbatim.
const TYPESCRIPT_TEMPLATES: &[(&str, &str)] = &[
    ("app.ts", include_str!("typescript/app.ts.in")),
    ("tsconfig.json", include_str!("typescript/tsconfig.json.in")),
    ("build.sh", include_str!("typescript/build.sh.in")),
    ("test.sh", include_str!("test.sh.in")),
    ("sluice-operator/index.ts", include_str!("../../../guest-sdk-ts/src/index.ts")),
    ("sluice-operator/encoding.ts", include_str!("../../../guest-sdk-ts/src/encoding.ts")),
    ("sluice-operator/json.ts", include_str!("../../../guest-sdk-ts/src/json.ts")),
    ("sluice-operator/moment.ts", include_str!("../../../guest-sdk-ts/src/moment.ts")),
    ("sluice-operator/window.ts", include_str!("../../../guest-sdk-ts/src/window.ts")),
    ("sluice-operator/wit.d.ts", include_str!("../../../guest-sdk-ts/src/wit.d.ts")),
    ("sluice-operator/runtime.d.ts", include_str!("../../../guest-sdk-ts/src/runtime.d.ts")),
    ("wit/operator.wit", include_str!("../../../wit/operator.wit")),
    ("fixtures/input.jsonl", include_str!("input.jsonl.in")),
    ("fixtures/expected.jsonl", include_str!("expected.jsonl.in")),
    ("README.md", include_str!("typescript/README.md.in")),
    (".gitignore", "*.wasm\nbuild/\nnode_modules/\n"),
];

/// The scripts of a new Python or TypeScript operator, written executable.
const SCRIPTS: &[&str] = &["build.sh", "test.sh"];

/// The componentize-py a new Python operator is built with: the version `./dev.sh`
/// installs (a test checks they agree).
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// The componentize-js and TypeScript a new TypeScript operator is built with: the
/// versions `./dev.sh` installs (a test checks they agree).
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";
/// See [`COMPONENTIZE_JS_VERSION`].
pub const TYPESCRIPT_VERSION: &str = "6.0.3";

/// The version of the SDK (`sluice-guest`) this binary's host serves, which a new crate
/// depends on: the workspace's version, which the SDK shares.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

/// Writes the operator `name` in `language` into `dir` (which must not exist); returns
/// the files written. A Rust crate depends on the SDK by [`SDK_VERSION`], or on the SDK
/// crate in the directory `sdk` (a checkout's `guest-sdk`, or an unpacked copy); a
/// Python or TypeScript project holds its SDK, and takes no `sdk`.
pub fn new_operator(name: &str, dir: &Path, sdk: Option<&Path>, language: Language) -> Result<Vec<PathBuf>> {
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!("{name:?} is not an operator name: lowercase letters, digits, - and _, starting with a letter");
    }
    let dependency = match sdk {
        None => format!("\"{SDK_VERSION}\""),
        Some(_) if language != Language::Rust => {
            bail!("--sdk names the Rust SDK; a {language:?} operator is written with its SDK inside")
        }
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
    let templates = match language {
        Language::Rust => RUST_TEMPLATES,
        Language::Python => PYTHON_TEMPLATES,
        Language::TypeScript => TYPESCRIPT_TEMPLATES,
    };
    let mut written = Vec::new();
    for (relative, template) in templates {
        let text = template
            .replace("{{name}}", name)
            .replace("{{file}}", &file)
            .replace("{{type}}", &type_name)
            .replace("{{sdk}}", &dependency)
            .replace("{{sdk_version}}", SDK_VERSION)
            .replace("{{componentize_py}}", COMPONENTIZE_PY_VERSION)
            .replace("{{componentize_js}}", COMPONENTIZE_JS_VERSION)
            .replace("{{typescript}}", TYPESCRIPT_VERSION);
        let path = dir.join(relative);
        std::fs::create_dir_all(path.parent().unwrap_or(dir))?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        if SCRIPTS.contains(relative) {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
        }
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
        new_operator("click-counter", &dir, None, Language::Rust)?;
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml"))?;
        assert!(manifest.contains(&format!("sluice-guest = \"{SDK_VERSION}\"")), "{manifest}");
        let lib = std::fs::read_to_string(dir.join("src/lib.rs"))?;
        assert!(lib.contains("pub struct ClickCounter;") && lib.contains("export_operator!(ClickCounter);"));
        assert!(std::fs::read_to_string(dir.join("README.md"))?.contains("release/click_counter.wasm"));
        for file in ["Cargo.toml", "README.md", "tests/sandbox.rs"] {
            assert!(!std::fs::read_to_string(dir.join(file))?.contains("{{"), "every placeholder filled: {file}");
        }
        let again = new_operator("click-counter", &dir, None, Language::Rust).unwrap_err().to_string();
        assert!(again.contains("exists already"), "{again}");
        let bad =
            new_operator("Click Counter", &scratch.path().join("x"), None, Language::Rust).unwrap_err().to_string();
        assert!(bad.contains("is not an operator name"), "{bad}");
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-sdk");
        let local = scratch.path().join("local");
        new_operator("local", &local, Some(&sdk), Language::Rust)?;
        let manifest = std::fs::read_to_string(local.join("Cargo.toml"))?;
        let path = std::fs::canonicalize(&sdk)?.display().to_string();
        assert!(manifest.contains(&format!("sluice-guest = {{ path = {path:?} }}")), "{manifest}");
        let not_sdk =
            new_operator("x", &scratch.path().join("y"), Some(scratch.path()), Language::Rust).unwrap_err().to_string();
        assert!(not_sdk.contains("holds no SDK crate"), "{not_sdk}");
        Ok(())
    }

    /// A Python or TypeScript project holds the app, this binary's SDK and world verbatim,
    /// and executable build and test scripts naming the component; it takes no `--sdk`.
    #[test]
    fn a_python_or_typescript_operator_holds_its_sdk_and_world_and_scripts() -> Result<()> {
        let python = [
            ("sluice_operator/__init__.py", "guest-sdk-python/sluice_operator/__init__.py"),
            ("sluice_operator/encoding.py", "guest-sdk-python/sluice_operator/encoding.py"),
            ("sluice_operator/window.py", "guest-sdk-python/sluice_operator/window.py"),
        ];
        let typescript = [
            ("sluice-operator/index.ts", "guest-sdk-ts/src/index.ts"),
            ("sluice-operator/encoding.ts", "guest-sdk-ts/src/encoding.ts"),
            ("sluice-operator/json.ts", "guest-sdk-ts/src/json.ts"),
            ("sluice-operator/moment.ts", "guest-sdk-ts/src/moment.ts"),
            ("sluice-operator/window.ts", "guest-sdk-ts/src/window.ts"),
            ("sluice-operator/wit.d.ts", "guest-sdk-ts/src/wit.d.ts"),
            ("sluice-operator/runtime.d.ts", "guest-sdk-ts/src/runtime.d.ts"),
        ];
        // Every file of each SDK is copied (a new one left out would break the build of
        // every new project).
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for (sdk, copies) in [("guest-sdk-python/sluice_operator", &python[..]), ("guest-sdk-ts/src", &typescript[..])]
        {
            for file in std::fs::read_dir(root.join(sdk))? {
                let file = file?;
                if file.file_type()?.is_dir() {
                    continue; // __pycache__, where Python was run over the SDK
                }
                let source = format!("{sdk}/{}", file.file_name().to_string_lossy());
                assert!(copies.iter().any(|(_, copied)| *copied == source), "{source} is in the scaffold");
            }
        }
        let cases = [(Language::Python, &python[..], "app.py"), (Language::TypeScript, &typescript[..], "app.ts")];
        for (language, sdk, app) in cases {
            let scratch = tempfile::tempdir()?;
            let dir = scratch.path().join("click-counter");
            new_operator("click-counter", &dir, None, language)?;
            for (written, source) in sdk.iter().chain(&[("wit/operator.wit", "wit/operator.wit")]) {
                assert_eq!(std::fs::read(dir.join(written))?, std::fs::read(root.join(source))?, "{written}");
            }
            for script in SCRIPTS {
                use std::os::unix::fs::PermissionsExt;
                let mode = std::fs::metadata(dir.join(script))?.permissions().mode();
                assert_eq!(mode & 0o111, 0o111, "{script} is executable");
                assert!(std::fs::read_to_string(dir.join(script))?.contains("click_counter.wasm"), "{script}");
            }
            for file in ["README.md", "build.sh", app] {
                assert!(!std::fs::read_to_string(dir.join(file))?.contains("{{"), "every placeholder filled: {file}");
            }
            let sdk = root.join("guest-sdk");
            let err = new_operator("x", &scratch.path().join("x"), Some(&sdk), language).unwrap_err();
            assert!(err.to_string().contains("operator is written with its SDK inside"), "{err}");
        }
        Ok(())
    }

    /// `./dev.sh` installs the componentize-py, componentize-js and TypeScript a new
    /// Python or TypeScript operator's build names.
    #[test]
    fn the_builds_name_the_tools_dev_sh_installs() -> Result<()> {
        let dev = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../dev.sh"))?;
        for line in [
            format!("COMPONENTIZE_PY_VERSION={COMPONENTIZE_PY_VERSION}\n"),
            format!("COMPONENTIZE_JS_VERSION={COMPONENTIZE_JS_VERSION}\n"),
            format!("TYPESCRIPT_VERSION={TYPESCRIPT_VERSION}\n"),
        ] {
            assert!(dev.contains(&line), "dev.sh: {line}");
        }
        Ok(())
    }
}
