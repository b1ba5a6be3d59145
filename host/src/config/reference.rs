//! The configuration reference: [`REFERENCE`], every setting of a job's config at its
//! default with what it does, as `sluice config --reference` prints it and
//! docs/configuration.md shows it. It is the one place a setting is described for users;
//! the fields' docs describe the types for this crate's readers.
//!
//! The defaults' values are written once in code — each section's `Default`, and serde's
//! default functions for `[operator]` (whose `path` is required) and the fields of each
//! kind of `[source]` — and the tests here hold the reference to them: parsing it gives
//! exactly those defaults, each other kind it shows is at its defaults, and every setting
//! appears in it. The values are not read from the reference instead, because serde fills
//! a section's missing settings from its `Default` before reading it (so a `Default` read
//! from the reference would need itself), and one file holds one kind of each section.

use std::io::Write;

/// The annotated configuration reference (`reference.toml`).
pub const REFERENCE: &str = include_str!("reference.toml");

/// Writes [`REFERENCE`] to `out`: `sluice config --reference`.
pub fn write_reference(mut out: impl Write) -> std::io::Result<()> {
    out.write_all(REFERENCE.as_bytes())?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, SinkConfig, SourceConfig};
    use std::path::Path;

    /// The other kinds of a section the reference shows (a run of commented lines from
    /// `# [source]` or `# [sink]`), uncommented.
    fn other_kinds() -> Vec<String> {
        let mut kinds: Vec<String> = Vec::new();
        let mut in_kind = false;
        for line in REFERENCE.lines() {
            if line.starts_with("# [source] ") || line.starts_with("# [sink] ") {
                kinds.push(String::new());
                in_kind = true;
            }
            in_kind &= line.starts_with('#');
            if in_kind {
                let kind = kinds.last_mut().expect("a kind begins at its section's line");
                kind.push_str(line.strip_prefix("# ").unwrap_or(line.trim_start_matches('#')));
                kind.push('\n');
            }
        }
        kinds
    }

    /// `kind` without its settings that have defaults: its tables' lines, its `kind` and
    /// the settings the reference marks required.
    fn required_only(kind: &str) -> String {
        let required = |line: &&str| line.starts_with('[') || line.starts_with("kind =") || line.contains("(required)");
        kind.lines().filter(required).map(|line| format!("{line}\n")).collect()
    }

    /// The config of `[operator] path` and `sections`, validated.
    fn parse(sections: &str) -> Config {
        let text = format!("[operator]\npath = \"operator.wasm\"\n{sections}");
        let config: Config = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        config.validate().unwrap();
        config
    }

    #[test]
    fn the_reference_is_the_defaults() {
        let reference: Config = toml::from_str(REFERENCE).unwrap();
        reference.validate().unwrap();
        assert_eq!(reference, Config::for_operator(Path::new("operator.wasm")));
        // Absent, the dead-letter file takes a name the reference says.
        assert!(REFERENCE.contains(&format!("absent: {}", crate::config::DEFAULT_DEAD_LETTER_PATH)));
    }

    #[test]
    fn the_other_kinds_in_the_reference_are_at_their_defaults() {
        let kinds = other_kinds();
        let names: Vec<String> = kinds
            .iter()
            .map(|kind| match parse(kind) {
                Config { source: SourceConfig::File { .. }, .. } => "file source".into(),
                Config { source: SourceConfig::Kafka { .. }, .. } => "kafka source".into(),
                Config { sink: SinkConfig::File { .. }, .. } => "file sink".into(),
                Config { sink: SinkConfig::Kafka { .. }, .. } => "kafka sink".into(),
                other => panic!("not another kind: {other:?}"),
            })
            .collect();
        assert_eq!(names, ["file source", "kafka source", "file sink", "kafka sink"]);
        for kind in &kinds {
            assert_eq!(parse(kind), parse(&required_only(kind)), "{kind}");
        }
    }

    /// Every field of every section — of the defaults and of each other kind — is named
    /// in the reference, as a setting or a table.
    #[test]
    fn every_setting_is_in_the_reference() {
        let defaults = Config::for_operator(Path::new("operator.wasm"));
        for config in std::iter::once(defaults).chain(other_kinds().iter().map(|kind| parse(kind))) {
            // Debug writes each field as `name: value`, and nothing else so.
            let debug = format!("{config:?}");
            for (at, _) in debug.match_indices(": ") {
                let before = &debug[..at];
                let start = before.rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
                let name = &before[start..];
                let named = [format!("\n{name} ="), format!("# {name} ="), format!("[{name}]"), format!(".{name}]")];
                assert!(named.iter().any(|named| REFERENCE.contains(named.as_str())), "{name} is not in the reference");
            }
        }
    }

    #[test]
    fn the_reference_is_written_whole() {
        let mut out = Vec::new();
        write_reference(&mut out).unwrap();
        assert_eq!(out, REFERENCE.as_bytes());
    }

    /// docs/configuration.md shows the reference whole, and says how to print it.
    #[test]
    fn the_configuration_doc_shows_the_reference() {
        let doc = include_str!("../../../docs/configuration.md");
        assert!(
            doc.contains(&format!("```toml\n{REFERENCE}```\n")),
            "docs/configuration.md differs from reference.toml"
        );
        assert!(doc.contains("sluice config --reference"));
    }
}
