//! `./dev.sh doctor` against scratch trees: set-up installs a prerequisite exactly when
//! what the build loads is absent, whatever look-alikes are present. And `./dev.sh
//! install`, which ships the binary without its debug info; `./dev.sh kafka`, a local
//! broker that `sluice generate --to` fills; and the README and `docs/`, whose links all
//! reach a file and a heading.
//!
//! The file checks are rooted at `SLUICE_SETUP_ROOT` and the test servers looked up in
//! `SLUICE_TOOLS`, so each case lays out a fake `/usr/lib/llvm-*` or tools directory.

use anyhow::{Context, Result};
use std::collections::HashSet;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

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

/// A program at `path` that prints `says` and exits 0: a tool reporting its version.
fn fake_program(path: &Path, says: &str) -> Result<()> {
    touch(path)?;
    std::fs::write(path, format!("#!/bin/sh\necho '{says}'\n"))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(())
}

/// Lays out `tools` as `cargo install --root tools` would after installing `crate_id`
/// (e.g. `s3s-fs 0.14.1`) with `features`.
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

/// The S3 test server counts only as cargo recorded installing it: that version, with
/// the feature that builds its binary.
#[test]
fn the_s3_server_counts_only_in_the_version_and_features_the_tests_need() -> Result<()> {
    let install = "missing: set-up will cargo install s3s-fs 0.14.1 --features binary";
    let root = tempfile::tempdir()?;
    let tools = root.path().join("tools");
    assert!(doctor_line("s3s-fs", root.path(), &tools)?.contains(install));
    fake_install(&tools, "s3s-fs", "s3s-fs 0.14.1", "")?;
    assert!(doctor_line("s3s-fs", root.path(), &tools)?.contains(install), "without the binary feature");
    fake_install(&tools, "s3s-fs", "s3s-fs 0.14.0", r#""binary""#)?;
    assert!(doctor_line("s3s-fs", root.path(), &tools)?.contains(install), "another version");
    fake_install(&tools, "s3s-fs", "s3s-fs 0.14.1", r#""binary""#)?;
    let line = doctor_line("s3s-fs", root.path(), &tools)?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// componentize-py, which builds the Python operators, counts only where set-up installs
/// it and at the version the Python SDK is tested with: a `componentize-py` that says
/// another version is missing.
#[test]
fn componentize_py_counts_only_at_the_version_the_python_sdk_is_built_with() -> Result<()> {
    let install = "missing: set-up will pip install componentize-py 0.25.1 into";
    let root = tempfile::tempdir()?;
    let tools = root.path().join("tools");
    assert!(doctor_line("componentize-py", root.path(), &tools)?.contains(install));
    let script = tools.join("componentize-py").join("bin").join("componentize-py");
    let fake = |version: &str| fake_program(&script, &format!("componentize-py {version}"));
    fake("0.25.0")?;
    assert!(doctor_line("componentize-py", root.path(), &tools)?.contains(install), "another version");
    fake("0.25.1")?;
    let line = doctor_line("componentize-py", root.path(), &tools)?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// componentize-js and tsc, which build the TypeScript operators, count only where set-up
/// installs them and at the versions the TypeScript SDK is tested with: either at another
/// version, or one without the other, is missing.
#[test]
fn the_typescript_tools_count_only_at_the_versions_the_typescript_sdk_is_built_with() -> Result<()> {
    let install = "missing: set-up will npm install componentize-js 0.23.0 and typescript 6.0.3 into";
    let root = tempfile::tempdir()?;
    let tools = root.path().join("tools");
    assert!(doctor_line("componentize-js", root.path(), &tools)?.contains(install));
    let bin = tools.join("typescript/node_modules/.bin");
    let fake = |name: &str, says: &str| fake_program(&bin.join(name), says);
    fake("componentize-js", "0.23.0")?;
    assert!(doctor_line("componentize-js", root.path(), &tools)?.contains(install), "no tsc");
    fake("tsc", "Version 5.9.3")?;
    assert!(doctor_line("componentize-js", root.path(), &tools)?.contains(install), "another tsc");
    fake("tsc", "Version 6.0.3")?;
    fake("componentize-js", "0.22.0")?;
    assert!(doctor_line("componentize-js", root.path(), &tools)?.contains(install), "another componentize-js");
    fake("componentize-js", "0.23.0")?;
    let line = doctor_line("componentize-js", root.path(), &tools)?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// Apache Kafka counts only as the jars Maven copies from dev/kafka/pom.xml, at the
/// versions it names: the broker's own, and the log4j2 binding without which it does
/// not log.
#[test]
fn the_kafka_broker_counts_only_as_its_jars_at_the_versions_the_tests_run() -> Result<()> {
    let install = "missing: set-up will mvn dependency:copy-dependencies of dev/kafka/pom.xml (Apache Kafka 4.4.0)";
    let root = tempfile::tempdir()?;
    let tools = root.path().join("tools");
    let lay_out = |kafka: &str, binding: bool| -> Result<()> {
        let libs = tools.join("kafka-4.4.0/libs");
        let modules = ["kafka_2.13", "kafka-server", "kafka-clients", "kafka-raft", "kafka-metadata", "kafka-storage"];
        let coordinators = ["kafka-group-coordinator", "kafka-transaction-coordinator"];
        for module in modules.iter().chain(&coordinators) {
            touch(&libs.join(format!("{module}-{kafka}.jar")))?;
        }
        for jar in ["scala-library-2.13.18", "slf4j-api-1.7.36", "log4j-api-2.25.5", "log4j-core-2.25.5"] {
            touch(&libs.join(format!("{jar}.jar")))?;
        }
        if binding {
            touch(&libs.join("log4j-slf4j-impl-2.25.5.jar"))?;
        }
        Ok(())
    };
    assert!(doctor_line("kafka", root.path(), &tools)?.contains(install));
    lay_out("4.3.0", true)?;
    assert!(doctor_line("kafka", root.path(), &tools)?.contains(install), "another version's jars");
    std::fs::remove_dir_all(&tools)?;
    lay_out("4.4.0", false)?;
    assert!(doctor_line("kafka", root.path(), &tools)?.contains(install), "without the log4j2 binding");
    lay_out("4.4.0", true)?;
    let line = doctor_line("kafka", root.path(), &tools)?;
    assert!(line.ends_with(" ok"), "{line}");
    Ok(())
}

/// `./dev.sh install` puts a binary without debug info in PREFIX/bin, and the debug info
/// beside it, named in the binary: what is installed runs and is a fraction of the size.
#[test]
fn install_splits_the_debug_info_off_the_binary() -> Result<()> {
    let prefix = tempfile::tempdir()?;
    let built = sluice_e2e::sluice_bin();
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

/// `./dev.sh kafka start` starts the tests' one-node broker in the background and prints
/// its address (a second start says it runs already); `sluice generate --to` produces
/// the generator's records to a topic there, which the broker creates with 4
/// partitions: exactly the records `sluice generate` prints, each keyed by its vehicle
/// and timestamped with its `ts`; `./dev.sh kafka stop` stops the broker.
#[test]
fn the_local_broker_takes_the_generators_records_and_stops() -> Result<()> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let home = tempfile::tempdir()?;
    let (port, controller) = (sluice_e2e::free_port()?, sluice_e2e::free_port()?);
    let dev_sh = repository_root()?.join("dev.sh");
    let kafka = |command: &str| -> Result<String> {
        let output = Command::new("bash")
            .arg(&dev_sh)
            .args(["kafka", command])
            .env("SLUICE_KAFKA_HOME", home.path())
            .env("SLUICE_KAFKA_PORT", port.to_string())
            .env("SLUICE_KAFKA_CONTROLLER_PORT", controller.to_string())
            .output()?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        anyhow::ensure!(
            output.status.success(),
            "kafka {command}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(stdout)
    };
    let bootstrap = format!("127.0.0.1:{port}");
    let started = kafka("start")?;
    // Stopped however the test ends.
    struct Stop<F: Fn(&str) -> Result<String>>(F);
    impl<F: Fn(&str) -> Result<String>> Drop for Stop<F> {
        fn drop(&mut self) {
            (self.0)("stop").ok();
        }
    }
    let stop = Stop(kafka);
    assert!(started.contains(&format!("Apache Kafka 4.4.0 at {bootstrap}")), "{started}");
    assert!((stop.0)("start")?.contains("already running"));

    let fleet = ["--vehicles", "20", "--count", "500", "--seed", "3"];
    let produced = sluice_e2e::sluice()
        .arg("generate")
        .args(fleet)
        .args(["--to", &format!("kafka://{bootstrap}/positions")])
        .output()?;
    let stderr = String::from_utf8_lossy(&produced.stderr);
    assert!(produced.status.success() && stderr.contains("produced 500 records to topic positions"), "{stderr}");
    let printed = sluice_e2e::sluice().arg("generate").args(fleet).output()?;
    let mut expected: Vec<(String, String, i64)> = String::from_utf8(printed.stdout)?
        .lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)?;
            let key = value["vehicle_id"].as_str().context("vehicle_id")?.to_string();
            Ok((key, line.to_string(), value["ts"].as_i64().context("ts")?))
        })
        .collect::<Result<_>>()?;

    let consumer: BaseConsumer =
        rdkafka::ClientConfig::new().set("bootstrap.servers", &bootstrap).set("group.id", "setup-check").create()?;
    let metadata = consumer.fetch_metadata(Some("positions"), Duration::from_secs(10))?;
    let partitions = metadata.topics()[0].partitions().len();
    assert_eq!(partitions, 4, "the local broker creates topics with 4 partitions");
    let mut assignment = rdkafka::TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment.add_partition_offset("positions", p, rdkafka::Offset::Beginning)?;
    }
    consumer.assign(&assignment)?;
    let mut read = Vec::new();
    let started = std::time::Instant::now();
    while read.len() < expected.len() && started.elapsed() < Duration::from_secs(60) {
        let Some(message) = consumer.poll(Duration::from_millis(100)) else { continue };
        let message = message?;
        let text = |bytes: Option<&[u8]>| String::from_utf8_lossy(bytes.unwrap_or_default()).into_owned();
        let timestamp = message.timestamp().to_millis().context("a timestamp")?;
        read.push((text(message.key()), text(message.payload()), timestamp));
    }
    expected.sort();
    read.sort();
    assert_eq!(read, expected, "the topic holds the records the generator prints, keyed and timestamped");

    let stopped = (stop.0)("stop")?;
    assert!(stopped.contains("stopped"), "{stopped}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err(), "nothing listens once stopped");
    assert!((stop.0)("stop")?.contains("not running"));
    Ok(())
}

/// The repository's root, where the README and `docs/` are.
fn repository_root() -> Result<PathBuf> {
    Ok(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize()?)
}

/// The README and every Markdown file of `docs/`, in order.
fn documentation_files() -> Result<Vec<PathBuf>> {
    let root = repository_root()?;
    let mut files = vec![root.join("README.md")];
    for entry in std::fs::read_dir(root.join("docs")).context("reading docs/")? {
        let path = entry?.path();
        if path.extension().is_some_and(|extension| extension == "md") {
            files.push(path);
        }
    }
    files[1..].sort();
    Ok(files)
}

/// A Markdown text with its fenced code blocks blanked, line for line: what renders as
/// prose, headings and links.
fn without_code_blocks(markdown: &str) -> String {
    let mut fence: Option<String> = None;
    let mut lines = Vec::new();
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        let marker: String = trimmed.chars().take_while(|c| *c == '`' || *c == '~').collect();
        let opens = marker.len() >= 3 && marker.chars().all(|c| c == marker.chars().next().unwrap());
        match &fence {
            None if opens => fence = Some(marker),
            Some(open) if opens && marker.starts_with(open.as_str()) && trimmed.trim() == marker => fence = None,
            None => {
                lines.push(line);
                continue;
            }
            Some(_) => {}
        }
        lines.push("");
    }
    lines.join("\n")
}

/// `prose` with its code spans (`` `…` ``, ``` ``…`` ```) blanked, newlines kept. A span
/// ends in its paragraph.
fn without_code_spans(prose: &str) -> String {
    prose.split("\n\n").map(paragraph_without_code_spans).collect::<Vec<_>>().join("\n\n")
}

fn paragraph_without_code_spans(paragraph: &str) -> String {
    let chars: Vec<char> = paragraph.chars().collect();
    let mut text = String::with_capacity(paragraph.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            text.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        // The span ends at the next run of exactly as many backticks; without one, the
        // backticks are text.
        let mut end = None;
        let mut j = i + run;
        while j < chars.len() {
            let next = chars[j..].iter().take_while(|c| **c == '`').count();
            if next == run {
                end = Some(j + run);
                break;
            }
            j += next.max(1);
        }
        match end {
            Some(end) => {
                text.extend(chars[i..end].iter().map(|c| if *c == '\n' { '\n' } else { ' ' }));
                i = end;
            }
            None => {
                text.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    text
}

/// The anchor GitHub gives a heading: lowercase, spaces to `-`, every other character
/// but letters, digits, `-` and `_` dropped.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings; a repeated heading's get `-1`, `-2`… as on
/// GitHub.
fn heading_anchors(markdown: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    for line in without_code_blocks(markdown).lines() {
        let level = line.chars().take_while(|c| *c == '#').count();
        let Some(heading) = line[level..].strip_prefix(' ').filter(|_| (1..=6).contains(&level)) else {
            continue;
        };
        let anchor = heading_anchor(heading.trim_end_matches('#'));
        let mut numbered = anchor.clone();
        for n in 1.. {
            if anchors.insert(numbered.clone()) {
                break;
            }
            numbered = format!("{anchor}-{n}");
        }
    }
    anchors
}

/// The targets of a Markdown text's links and images, `[text](target)` and `[label]:
/// target`, outside code.
fn link_targets(markdown: &str) -> Vec<String> {
    let prose = without_code_spans(&without_code_blocks(markdown));
    let mut targets = Vec::new();
    for (start, _) in prose.match_indices("](") {
        let rest = &prose[start + 2..];
        let mut depth = 0;
        let end = rest
            .find(|c: char| {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 0 => return true,
                    ')' => depth -= 1,
                    _ => {}
                }
                c.is_whitespace()
            })
            .unwrap_or(rest.len());
        targets.push(rest[..end].trim_start_matches('<').trim_end_matches('>').to_string());
    }
    for line in prose.lines() {
        let line = line.trim_start();
        if let Some((label, target)) = line.strip_prefix('[').and_then(|line| line.split_once("]:"))
            && !label.contains(']')
        {
            targets.extend(target.split_whitespace().next().map(str::to_string));
        }
    }
    targets
}

/// Every relative link of the README and of `docs/` reaches a file that exists, relative
/// to the file linking it, and a link's `#fragment` one of that file's headings (as GitHub
/// makes anchors of them). Links to the web (`http:`, `https:`, `mailto:`) and anything
/// inside code are not links to check.
#[test]
fn readme_and_docs_links_reach_their_files_and_headings() -> Result<()> {
    let root = repository_root()?;
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in documentation_files()? {
        let markdown = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
        let name = file.strip_prefix(&root)?.display().to_string();
        for target in link_targets(&markdown) {
            if ["http://", "https://", "mailto:"].iter().any(|scheme| target.starts_with(scheme)) {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            if !linked.exists() {
                broken.push(format!("{name}: ({target}): no file {}", linked.display()));
            } else if !fragment.is_empty() {
                let text = std::fs::read_to_string(&linked).unwrap_or_default();
                if linked.extension().is_none_or(|extension| extension != "md") {
                    broken.push(format!("{name}: ({target}): a #fragment of a file that is not Markdown"));
                } else if !heading_anchors(&text).contains(fragment) {
                    broken.push(format!("{name}: ({target}): no heading #{fragment} in {}", linked.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "{} of {checked} links broken:\n{}", broken.len(), broken.join("\n"));
    assert!(checked > 50, "only {checked} links found: is the reading of links broken?");
    Ok(())
}

/// The README is the map of `docs/`: it links every file there.
#[test]
fn readme_links_every_doc() -> Result<()> {
    let readme = std::fs::read_to_string(repository_root()?.join("README.md"))?;
    let targets: HashSet<String> =
        link_targets(&readme).into_iter().map(|target| target.split('#').next().unwrap().to_string()).collect();
    for file in &documentation_files()?[1..] {
        let doc = format!("docs/{}", file.file_name().unwrap().to_string_lossy());
        assert!(targets.contains(&doc), "the README does not link {doc}");
    }
    Ok(())
}
