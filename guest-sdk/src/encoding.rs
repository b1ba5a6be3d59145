//! How typed state values become bytes and back.
//!
//! This module owns the two encodings a [`State`](crate::State) writes and the rule that
//! tells them apart when reading; it does not own where the bytes are stored (the host
//! does). JSON is the default: readable in `sluice state dump` and by any tool. The
//! compact binary encoding is MessagePack with field names, behind one marker byte:
//! numbers travel as machine words instead of decimal text, which saves parsing and
//! formatting on every read and write. Both are self-describing, so both keep
//! `#[serde(default)]` evolution: a later version of an operator adds a field with a
//! default and still reads what an earlier version wrote. Reading detects the encoding
//! from the first byte, so a value written one way is read by an operator configured the
//! other way, and switching encodings across a hot swap needs no migration. JSON has no
//! NaN or infinity (serde_json would write `null`, which does not read back as a
//! number), so a value holding one is refused in JSON rather than stored broken.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// How [`State::put`](crate::State::put) encodes values. Reading accepts either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// JSON text (the default).
    #[default]
    Json,
    /// MessagePack with field names, after the byte [`BINARY_MARKER`].
    Binary,
}

/// The first byte of a binary-encoded value. 0xC1 is never valid UTF-8 (an overlong
/// form), so no JSON document starts with it; MessagePack leaves it unused too.
pub const BINARY_MARKER: u8 = 0xC1;

/// Why a value could not be encoded or decoded.
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// `value` encoded as `encoding` says. Fails for a value holding a NaN or an infinite
/// float in JSON, which cannot hold one.
pub fn encode<T: Serialize + ?Sized>(value: &T, encoding: Encoding) -> Result<Vec<u8>, Error> {
    match encoding {
        Encoding::Json => {
            let json = serde_json::to_vec(value).map_err(|e| Error(e.to_string()))?;
            // serde_json writes a non-finite float as `null`: only a value with a `null`
            // can hold one, so only those pay for the look.
            if json.windows(4).any(|w| w == b"null") && holds_non_finite(value)? {
                return Err(Error(
                    "the value holds a NaN or infinite number, which JSON cannot store (it would read back as null); \
                     keep such numbers out of state, or store state with Encoding::Binary"
                        .into(),
                ));
            }
            Ok(json)
        }
        Encoding::Binary => {
            let mut bytes = vec![BINARY_MARKER];
            rmp_serde::encode::write_named(&mut bytes, value).map_err(|e| Error(e.to_string()))?;
            Ok(bytes)
        }
    }
}

/// Whether `value` holds a NaN or an infinite float anywhere, as its MessagePack form
/// (which keeps them) says.
fn holds_non_finite<T: Serialize + ?Sized>(value: &T) -> Result<bool, Error> {
    fn any_non_finite(value: &rmpv::Value) -> bool {
        match value {
            rmpv::Value::F32(f) => !f.is_finite(),
            rmpv::Value::F64(f) => !f.is_finite(),
            rmpv::Value::Array(items) => items.iter().any(any_non_finite),
            rmpv::Value::Map(entries) => entries.iter().any(|(k, v)| any_non_finite(k) || any_non_finite(v)),
            _ => false,
        }
    }
    let bytes = rmp_serde::to_vec(value).map_err(|e| Error(e.to_string()))?;
    let value = rmpv::decode::read_value(&mut bytes.as_slice()).map_err(|e| Error(e.to_string()))?;
    Ok(any_non_finite(&value))
}

/// The value in `bytes`, whichever encoding wrote it. Bytes left over after the value
/// are an error in either encoding.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, Error> {
    let Some((&BINARY_MARKER, rest)) = bytes.split_first() else {
        return serde_json::from_slice(bytes).map_err(|e| Error(e.to_string()));
    };
    let mut binary = rmp_serde::Deserializer::new(std::io::Cursor::new(rest));
    let value = T::deserialize(&mut binary).map_err(|e| Error(e.to_string()))?;
    match rest.len() as u64 - binary.position() {
        0 => Ok(value),
        left => Err(Error(format!("{left} bytes left over after the value"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Before {
        name: String,
        count: u64,
        mean: f64,
    }

    /// `Before` with a field added the way an operator's next version adds one.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct After {
        name: String,
        count: u64,
        mean: f64,
        #[serde(default)]
        idle: u64,
    }

    fn before() -> Before {
        Before { name: "v-1".into(), count: 3, mean: 51.25 }
    }

    #[test]
    fn each_encoding_reads_what_the_other_wrote() {
        let json = encode(&before(), Encoding::Json).unwrap();
        let binary = encode(&before(), Encoding::Binary).unwrap();
        assert_eq!(json[0], b'{');
        assert_eq!(binary[0], BINARY_MARKER);
        assert!(binary.len() < json.len(), "binary {} bytes, JSON {}", binary.len(), json.len());
        assert_eq!(decode::<Before>(&json).unwrap(), before());
        assert_eq!(decode::<Before>(&binary).unwrap(), before());
    }

    #[test]
    fn an_added_field_with_a_default_reads_values_written_without_it() {
        for encoding in [Encoding::Json, Encoding::Binary] {
            let old = encode(&before(), encoding).unwrap();
            let read: After = decode(&old).unwrap();
            assert_eq!(read, After { name: "v-1".into(), count: 3, mean: 51.25, idle: 0 }, "{encoding:?}");
            // And the earlier version reads the later one's value, ignoring the new field.
            let new = encode(&After { idle: 7, ..read }, encoding).unwrap();
            assert_eq!(decode::<Before>(&new).unwrap(), before(), "{encoding:?}");
        }
    }

    #[test]
    fn json_refuses_a_non_finite_float_that_it_would_store_as_null() {
        for bad in [f64::NAN, f64::INFINITY, f64::MAX * 2.0, f64::NEG_INFINITY] {
            let err = encode(&Before { mean: bad, ..before() }, Encoding::Json).unwrap_err();
            assert!(err.to_string().contains("NaN or infinite"), "{bad}: {err}");
            assert!(encode(&vec![Some(1.0), None, Some(bad)], Encoding::Json).is_err(), "{bad} in a list");
            let binary = encode(&Before { mean: bad, ..before() }, Encoding::Binary).unwrap();
            assert_eq!(decode::<Before>(&binary).unwrap().mean.to_bits(), bad.to_bits(), "binary keeps {bad}");
        }
        // A null of its own is fine.
        let json = encode(&vec![Some(1.5), None], Encoding::Json).unwrap();
        assert_eq!(decode::<Vec<Option<f64>>>(&json).unwrap(), [Some(1.5), None]);
    }

    #[test]
    fn a_value_of_another_shape_is_an_error_in_either_encoding() {
        for encoding in [Encoding::Json, Encoding::Binary] {
            let bytes = encode(&"just a string", encoding).unwrap();
            assert!(decode::<Before>(&bytes).is_err(), "{encoding:?}");
        }
        assert!(decode::<Before>(&[BINARY_MARKER, 0xFF]).is_err());
        let mut trailing = encode(&before(), Encoding::Binary).unwrap();
        trailing.push(0);
        assert!(decode::<Before>(&trailing).is_err(), "a value with bytes after it");
    }
    /// The vectors the Python and TypeScript SDKs are checked against
    /// (`testdata/binary-encoding.json`): each value, typed here as a Rust operator's state
    /// would be, is the bytes given, and those bytes read back as the value given.
    #[test]
    fn the_binary_encoding_writes_the_shared_vectors() {
        use crate::window::Window;
        use std::collections::BTreeMap;

        #[derive(Serialize)]
        struct Speeds {
            vehicle_id: &'static str,
            positions: u64,
            sum_kmh: f64,
            max_kmh: f64,
        }
        #[derive(Serialize)]
        struct Sum {
            count: u64,
            sum: u64,
        }
        #[derive(Serialize)]
        struct Sessions {
            open: Vec<Window<Sum>>,
            closed: Vec<(u64, u64)>,
        }
        #[derive(Serialize)]
        struct Floats {
            zero: f64,
            negative_zero: f64,
            half: f64,
            huge: f64,
            tiny: f64,
            speed: f64,
            whole: f64,
        }
        #[derive(Serialize)]
        struct Lists {
            fifteen: Vec<u8>,
            sixteen: Vec<u16>,
            empty: Vec<u32>,
            nested: Vec<Vec<&'static str>>,
        }
        #[derive(Serialize)]
        struct Options {
            some: Option<u64>,
            none: Option<u64>,
            yes: bool,
            no: bool,
        }

        let window = |start_ms, vehicle_id, positions, sum_kmh, max_kmh| Window {
            start_ms,
            end_ms: start_ms + 60_000,
            aggregate: Speeds { vehicle_id, positions, sum_kmh, max_kmh },
        };
        fn binary<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
            encode(value, Encoding::Binary).unwrap()
        }
        let floats = Floats {
            zero: 0.0,
            negative_zero: -0.0,
            half: 1.5,
            huge: 1e300,
            tiny: -2.5e-300,
            speed: 40.58,
            whole: 100.0,
        };
        let lists = Lists {
            fifteen: (0..15).collect(),
            sixteen: (0..16).collect(),
            empty: vec![],
            nested: vec![vec!["a"], vec![]],
        };
        let sessions = Sessions {
            open: vec![Window { start_ms: 1_000, end_ms: 1_400, aggregate: Sum { count: 2, sum: 70 } }],
            closed: vec![(200, 600), (1 << 32, (1 << 32) + 4)],
        };
        let (x31, y32, z255, w256) = ("x".repeat(31), "y".repeat(32), "z".repeat(255), "w".repeat(256));
        let encoded = [
            (
                "windows",
                binary(&[
                    window(1_700_000_040_000, "veh-0042", 3, 151.5, 60.25),
                    window(1_700_000_100_000, "", 0, 0.0, 0.0),
                ]),
            ),
            ("sessions", binary(&sessions)),
            ("unsigned", binary(&[0u64, 127, 128, 255, 256, 65_535, 65_536, (1 << 32) - 1, 1 << 32, (1 << 53) - 1])),
            (
                "signed",
                binary(&[
                    -1i64,
                    -32,
                    -33,
                    -128,
                    -129,
                    -32_768,
                    -32_769,
                    -(1 << 31),
                    -(1 << 31) - 1,
                    1 - (1 << 53),
                    5,
                    300,
                    1 << 32,
                ]),
            ),
            ("floats", binary(&floats)),
            ("strings", binary(&["", "a", &x31, &y32, &z255, &w256, "é", "日本", "\"\\\n"])),
            ("lists", binary(&lists)),
            ("sixteen fields", binary(&"abcdefghijklmnop".chars().zip(0u64..).collect::<BTreeMap<_, _>>())),
            ("options", binary(&Options { some: Some(3), none: None, yes: true, no: false })),
        ];

        let vectors: Vec<serde_json::Value> =
            serde_json::from_str(include_str!("../testdata/binary-encoding.json")).unwrap();
        assert_eq!(vectors.len(), encoded.len(), "a vector for each value typed here");
        for ((name, bytes), vector) in encoded.iter().zip(&vectors) {
            assert_eq!(vector["name"], *name);
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(hex, vector["hex"].as_str().unwrap(), "{name}: the bytes rmp-serde writes");
            let read: serde_json::Value = decode(bytes).unwrap();
            assert_eq!(read, vector["value"], "{name}: the value they hold");
        }
    }
}
