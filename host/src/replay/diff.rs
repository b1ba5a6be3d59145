//! How two runs' outputs of the same records differ.
//!
//! Outputs are compared by their origin — the record at an offset, or the expiries and
//! timers before it (`cause`) — since that is what two versions of an operator share:
//! a version may emit more, fewer or other outputs for a record, never for another
//! one. Two origins' outputs are equal when they are as many and each pair matches
//! field by field ([`differing_fields`], exact), the `operator` field aside (it names
//! the build, which differs by design). This module owns that comparison and its
//! report; it does not own where the outputs come from.

use crate::lines::{Compare, FieldDifference, differing_fields, read_line_bounded};
use anyhow::{Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// What emitted a group of outputs: the record at `offset`, or (`cause` set) the
/// expiries or timers that came before it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct OriginKey {
    /// The record's offset.
    pub offset: u64,
    /// `expiry` or `timer`; absent for the record's own outputs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

/// One origin whose outputs differ.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// What emitted them.
    #[serde(flatten)]
    pub origin: OriginKey,
    /// The key of its first output (either side's).
    pub key: Value,
    /// The first run's output lines for it, as they were written.
    pub left: Vec<Value>,
    /// The second run's.
    pub right: Vec<Value>,
    /// The fields that differ: `outputs` when the counts differ, else each pair's
    /// fields (`value.count`), prefixed `[i].` past the first pair.
    pub fields: Vec<FieldDifference>,
}

/// How the outputs of two runs over the same records compared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputDiff {
    /// Origins compared: every record, and every group of expiries or timers either
    /// run emitted something for.
    pub compared: u64,
    /// Origins whose outputs were equal (records neither emitted for included).
    pub equal: u64,
    /// Origins both runs emitted for, differently.
    pub different: u64,
    /// Origins only the first run emitted for.
    pub only_left: u64,
    /// Origins only the second run emitted for.
    pub only_right: u64,
    /// Every difference, in origin order.
    pub differences: Vec<Difference>,
}

impl OutputDiff {
    /// Compares `left` and `right`, the output lines two runs wrote for the same
    /// `records` records (lines as the file sink writes them, of those records alone).
    pub fn of(left: &[Value], right: &[Value], records: u64) -> Self {
        let (left, right) = (by_origin(left), by_origin(right));
        let mut diff = OutputDiff::default();
        let mut origins: Vec<&OriginKey> = left.keys().chain(right.keys()).collect();
        origins.sort_unstable();
        origins.dedup();
        // Every record, whether or not either run emitted for it, and every origin
        // either run emitted for that is not one of them: expiry and timer groups, and
        // lines at offsets the records did not reach.
        let (caused, recorded) = origins.iter().fold((0, 0), |(c, r), o| match o.cause {
            Some(_) => (c + 1, r),
            None => (c, r + 1),
        });
        diff.compared = records.max(recorded) + caused;
        for origin in origins {
            let empty = Vec::new();
            let (l, r) = (left.get(origin).unwrap_or(&empty), right.get(origin).unwrap_or(&empty));
            let fields = fields_of(l, r);
            if fields.is_empty() {
                continue;
            }
            match (l.is_empty(), r.is_empty()) {
                (false, true) => diff.only_left += 1,
                (true, false) => diff.only_right += 1,
                _ => diff.different += 1,
            }
            let key = l.iter().chain(r).map(key_of).next().unwrap_or(Value::Null);
            let (left, right) = (l.iter().map(|v| (*v).clone()).collect(), r.iter().map(|v| (*v).clone()).collect());
            diff.differences.push(Difference { origin: origin.clone(), key, left, right, fields });
        }
        diff.equal = diff.compared - diff.different - diff.only_left - diff.only_right;
        diff
    }
}

/// The output lines of `partition` from `from` up to `until` (exclusive) in the JSONL
/// file at `path`, as the file sink writes them; blank lines skipped, anything else
/// that is not such a line an error naming the line — one longer than `max_line_bytes`
/// too, read no further than that.
pub fn read_outputs(path: &Path, partition: u32, from: u64, until: u64, max_line_bytes: usize) -> Result<Vec<Value>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = std::io::BufReader::new(file);
    let (mut lines, mut line) = (Vec::new(), Vec::new());
    for number in 1.. {
        let at = || format!("{} line {number}", path.display());
        line.clear();
        let Some(read) = read_line_bounded(&mut reader, &mut line, max_line_bytes).with_context(at)? else { break };
        if read > max_line_bytes {
            return Err(anyhow::anyhow!(
                "{read} bytes, longer than any output line of this job can be ({max_line_bytes})"
            ))
            .with_context(at);
        }
        if line.trim_ascii().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_slice(&line).with_context(at)?;
        let (Some(p), Some(offset)) = (value["partition"].as_u64(), value["offset"].as_u64()) else {
            return Err(anyhow::anyhow!("not an output line: it has no \"partition\" and \"offset\"")).with_context(at);
        };
        if p == u64::from(partition) && (from..until).contains(&offset) {
            lines.push(value);
        }
    }
    Ok(lines)
}

/// `lines` by origin, each origin's in order.
fn by_origin(lines: &[Value]) -> BTreeMap<OriginKey, Vec<&Value>> {
    let mut grouped: BTreeMap<OriginKey, Vec<&Value>> = BTreeMap::new();
    for line in lines {
        let origin = OriginKey {
            offset: line["offset"].as_u64().unwrap_or_default(),
            cause: line["cause"].as_str().map(str::to_string),
        };
        grouped.entry(origin).or_default().push(line);
    }
    grouped
}

/// Where the outputs `left` and `right` of one origin differ; empty when they are equal.
fn fields_of(left: &[&Value], right: &[&Value]) -> Vec<FieldDifference> {
    if left.len() != right.len() {
        return vec![FieldDifference {
            path: "outputs".into(),
            left: Some(left.len().into()),
            right: Some(right.len().into()),
        }];
    }
    let mut fields = Vec::new();
    for (i, (l, r)) in left.iter().zip(right).enumerate() {
        for mut field in differing_fields(&without_operator(l), &without_operator(r), Compare::Exact) {
            if i > 0 {
                field.path = format!("[{i}].{}", field.path);
            }
            fields.push(field);
        }
    }
    fields
}

/// `line` without its `operator` field.
fn without_operator(line: &Value) -> Value {
    let mut line = line.clone();
    if let Some(fields) = line.as_object_mut() {
        fields.remove("operator");
    }
    line
}

/// The key of an output line (`key`, or `key_base64`).
fn key_of(line: &&Value) -> Value {
    line.get("key").or_else(|| line.get("key_base64")).cloned().unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn output(offset: u64, cause: Option<&str>, count: u64, operator: &str) -> Value {
        let mut line =
            json!({"partition": 0, "offset": offset, "key": "k", "value": {"count": count}, "operator": operator});
        if let Some(cause) = cause {
            line["cause"] = cause.into();
        }
        line
    }

    /// Equal outputs of other builds are equal; a changed field, an extra output, an
    /// origin only one side emitted for and an expiry's group each count once, in
    /// origin order, with the fields that differ.
    #[test]
    fn outputs_are_compared_by_origin_and_field() {
        let left = [
            output(0, None, 1, "op@a"),
            output(1, None, 2, "op@a"),
            output(2, Some("expiry"), 7, "op@a"),
            output(2, None, 3, "op@a"),
            output(4, None, 5, "op@a"),
        ];
        let mut changed = output(1, None, 2, "op@b");
        changed["value"]["extra"] = true.into();
        let right = [
            output(0, None, 1, "op@b"),
            changed,
            output(2, None, 3, "op@b"),
            output(3, None, 4, "op@b"),
            output(4, None, 5, "op@b"),
            output(4, None, 6, "op@b"),
        ];
        let diff = OutputDiff::of(&left, &right, 6);
        assert_eq!((diff.compared, diff.equal), (7, 3), "6 records and one expiry group; offsets 0, 2 and 5 equal");
        assert_eq!((diff.different, diff.only_left, diff.only_right), (2, 1, 1));
        let found: Vec<(u64, Option<&str>, &str)> = diff
            .differences
            .iter()
            .map(|d| (d.origin.offset, d.origin.cause.as_deref(), d.fields[0].path.as_str()))
            .collect();
        assert_eq!(
            found,
            [(1, None, "value.extra"), (2, Some("expiry"), "outputs"), (3, None, "outputs"), (4, None, "outputs")]
        );
        assert_eq!(diff.differences[0].fields[0].left, None);
        assert_eq!(diff.differences[0].fields[0].right, Some(true.into()));
        assert_eq!(diff.differences[0].key, json!("k"));
        assert_eq!(OutputDiff::of(&left, &left, 6).differences, []);
        let beyond = OutputDiff::of(&left, &right, 2);
        assert_eq!((beyond.compared, beyond.equal), (6, 2), "lines beyond the records processed are compared too");
    }
}
