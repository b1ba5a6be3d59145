//! `./dev.sh doctor` against scratch trees: set-up installs a prerequisite exactly when
//! what the build loads is absent, whatever look-alikes are present. And `./dev.sh
//! install`, which ships the binary without its debug info.
//!
//! The file checks are rooted at `SLUICE_SETUP_ROOT` and the test servers looked up in
//! `SLUICE_TOOLS`, so each case lays out a fake `/usr/lib/llvm-*` or tools directory.

use anyhow::{Context, Result};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The doctor's line for prerequisite `name` with the file checks rooted at `root` and
/// the test servers looked up in `tools`.
fn doctor_line(name: &str, root: &Path, tools: &Path) -> Result<String> {
    let dev_sh = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dev.sh");
    let output = Command::new("bash")
        .arg(&dev_sh)
        .arg("doctor")
        .env("SLUICE_SETUP_ROOT", root)
        .env("SLUICE_TOOLS", tools)
        .output()
        .with_context(|| format!("running {} doctor", dev_sh.display()))?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let prefix = format!("doctor: {name} ");
    let line = stderr.lines().find(|line| line.starts_with(&prefix));
    Ok(line.with_context(|| format!("no line for {name} in:\n{stderr}"))?.to_string())
}

fn touch(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(path, b"")?;
    Ok(())
}

fn libclang_line(layout: impl FnOnce(&Path) -> Result<()>) -> Result<String> {
    let root = tempfile::tempdir()?;
    layout(root.path())?;
    doctor_line("libclang", root.path(), &root.path().join("tools"))
}

const INSTALL_LIBCLANG: &str = "missing: set-up will apt-get install libclang-dev";

#[test]
fn libclang_is_installed_when_no_llvm_is_present() -> Result<()> {
    assert!(libclang_line(|_| Ok(()))?.ends_with(INSTALL_LIBCLANG));
    Ok(())
}

#[test]
fn libclang_cpp_is_not_libclang() -> Result<()> {
    // What a fresh machine has: libclang-cpp14, the C++ interface, and nothing else.
    let line = libclang_line(|root| {
        let lib = root.join("usr/lib/llvm-14/lib");
        touch(&lib.join("libclang-cpp.so.14"))?;
        symlink("libclang-cpp.so.14", lib.join("libclang-cpp.so"))?;
        Ok(())
    })?;
    assert!(line.ends_with(INSTALL_LIBCLANG), "{line}");
    Ok(())
}

#[test]
fn a_dangling_libclang_link_or_missing_builtin_headers_are_not_enough() -> Result<()> {
    let dangling = libclang_line(|root| {
        let lib = root.join("usr/lib/llvm-14/lib");
        std::fs::create_dir_all(&lib)?;
        symlink("libclang.so.1", lib.join("libclang.so"))?;
        touch(&lib.join("clang/14.0.6/include/stddef.h"))
    })?;
    assert!(dangling.ends_with(INSTALL_LIBCLANG), "{dangling}");
    let no_headers = libclang_line(|root| touch(&root.join("usr/lib/llvm-14/lib/libclang.so")))?;
    assert!(no_headers.ends_with(INSTALL_LIBCLANG), "{no_headers}");
    Ok(())
}

#[test]
fn libclang_dev_layout_is_present() -> Result<()> {
    // What libclang-dev installs: libclang.so (a link to the versioned library) and
    // clang's builtin headers next to it.
    let line = libclang_line(|root| {
        let lib = root.join("usr/lib/llvm-14/lib");
        touch(&lib.join("libclang.so.1"))?;
        symlink("libclang.so.1", lib.join("libclang.so"))?;
        touch(&lib.join("clang/14.0.6/include/stddef.h"))
    })?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// Lays out `tools` as `cargo install --root tools` would after installing `crate_id`
/// (e.g. `tansu 0.6.0`) with `features`.
fn fake_install(tools: &Path, bin: &str, crate_id: &str, features: &str) -> Result<()> {
    let path = tools.join("bin").join(bin);
    touch(&path)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let record = format!(
        r#"{{"installs":{{"{crate_id} (registry+https://github.com/rust-lang/crates.io-index)":{{"version_req":null,"bins":["{bin}"],"features":[{features}],"all_features":false,"no_default_features":false,"profile":"release"}}}}}}"#
    );
    std::fs::write(tools.join(".crates2.json"), record)?;
    Ok(())
}

#[test]
fn the_broker_counts_only_in_the_version_and_features_the_tests_need() -> Result<()> {
    let install = "missing: set-up will cargo install tansu 0.6.0 --features dynostore,libsql";
    let root = tempfile::tempdir()?;
    let tools = root.path().join("tools");
    assert!(doctor_line("tansu", root.path(), &tools)?.contains(install));

    fake_install(&tools, "tansu", "tansu 0.6.0", "")?;
    assert!(doctor_line("tansu", root.path(), &tools)?.contains(install), "without features");
    fake_install(&tools, "tansu", "tansu 0.6.0", r#""dynostore""#)?;
    assert!(doctor_line("tansu", root.path(), &tools)?.contains(install), "without libsql (SQLite storage)");
    fake_install(&tools, "tansu", "tansu 0.5.9", r#""dynostore","libsql""#)?;
    assert!(doctor_line("tansu", root.path(), &tools)?.contains(install), "another version");
    fake_install(&tools, "tansu", "tansu 0.6.0", r#""libsql","dynostore""#)?;
    let line = doctor_line("tansu", root.path(), &tools)?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// noida-db (the exactly-once tests' broker) counts only as pip recorded it in the
/// tools' virtual environment, in the version the tests need, with its command linked
/// where the tests look for it.
#[test]
fn the_transactional_broker_counts_only_in_the_version_the_tests_need() -> Result<()> {
    let install = "missing: set-up will pip install noida-db 0.2.3";
    let root = tempfile::tempdir()?;
    let tools = root.path().join("tools");
    let executable = |path: &Path, text: &str| -> Result<()> {
        touch(path)?;
        std::fs::write(path, text)?;
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(())
    };
    // What `python -m pip show noida-db` prints in a virtual environment holding it.
    let pip_records = |version: &str| {
        executable(
            &tools.join("noida-db/bin/python"),
            &format!(
                "#!/bin/sh\n[ \"$*\" = \"-m pip show noida-db\" ] && printf 'Name: noida-db\\nVersion: {version}\\n'\n"
            ),
        )
    };
    assert!(doctor_line("noida-db", root.path(), &tools)?.contains(install));
    pip_records("0.2.3")?;
    assert!(doctor_line("noida-db", root.path(), &tools)?.contains(install), "installed but not linked");
    executable(&tools.join("noida-db/bin/noida-db"), "")?;
    std::fs::create_dir_all(tools.join("bin"))?;
    symlink("../noida-db/bin/noida-db", tools.join("bin/noida-db"))?;
    pip_records("0.2.2")?;
    assert!(doctor_line("noida-db", root.path(), &tools)?.contains(install), "another version");
    pip_records("0.2.3")?;
    let line = doctor_line("noida-db", root.path(), &tools)?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// `./dev.sh install` puts a binary without debug info in PREFIX/bin, and the debug info
/// beside it, named in the binary: what is installed runs and is a fraction of the size.
#[test]
fn install_splits_the_debug_info_off_the_binary() -> Result<()> {
    let prefix = tempfile::tempdir()?;
    let built = sluice_tests::sluice_bin();
    let dev_sh = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../dev.sh");
    let output =
        Command::new("bash").arg(&dev_sh).arg("install").arg(prefix.path()).env("SLUICE_BIN", &built).output()?;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    let (installed, debug) = (prefix.path().join("bin/sluice"), prefix.path().join("bin/.debug/sluice.debug"));
    let size = |path: &Path| std::fs::metadata(path).map(|m| m.len());
    assert!(size(&installed)? * 4 < size(&built)?, "{} of {} bytes", size(&installed)?, size(&built)?);
    assert!(size(&debug)? > size(&installed)?);
    let sections = Command::new("readelf").arg("--section-headers").arg(&installed).output()?;
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(sections.contains(".gnu_debuglink") && !sections.contains(".debug_info"), "{sections}");
    let help = Command::new(&installed).arg("--help").output()?;
    assert!(help.status.success() && String::from_utf8_lossy(&help.stdout).contains("run"));
    Ok(())
}
