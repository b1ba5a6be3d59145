//! What a guest hands the host out of its memory — the outputs of a record and the
//! reason a record failed — checked before anything is copied.
//!
//! wasmtime lifts a function's results (and a host function's parameters) before any
//! host code sees them, and its own lifts copy every list: a guest that returns a
//! thousand outputs whose keys all point at one 32 MiB region of its memory would have
//! the host allocate 32 GiB before a limit is looked at. The types here implement
//! wasmtime's `Lift` themselves: they read each list's pointer and length first, check
//! the count and the total length against the [`LiftBounds`] of the instance making
//! the call, and copy only what passes. What does not pass is counted, not copied, and
//! the record fails naming the limit. These are the only types the host lifts a guest's
//! outputs and failure reasons into, for every world a component may be built against.
//!
//! wasmtime gives a lift no way to reach the store's data, so the bounds travel in a
//! thread-local set around each call into the guest ([`with_bounds`]): a call and the
//! lifts it makes run on the calling thread. This module owns that and the canonical
//! ABI layout of an `output-record`; it does not decide what a failure does.

use super::bindings::OutputRecord;
use crate::record::Output;
use std::cell::Cell;
use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext};
use wasmtime::component::{ComponentType, Lift};
use wasmtime::{ValRaw, bail};

/// How much of what a guest returns from one call the host copies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LiftBounds {
    /// Outputs of one record: `[operator.limits] outputs_per_record`.
    pub outputs: usize,
    /// Bytes of one record's outputs, keys, values and topics together:
    /// `[operator.limits] output_bytes_per_record`.
    pub output_bytes: usize,
    /// Bytes of a failure's reason: `[operator.limits] reason_bytes`.
    pub reason_bytes: usize,
}

thread_local! {
    /// The bounds of the call this thread is making into a guest (see the module docs).
    static BOUNDS: Cell<LiftBounds> = const { Cell::new(LiftBounds { outputs: 0, output_bytes: 0, reason_bytes: 0 }) };
}

/// Runs `call` (a call into a guest, or anything that lifts what a guest passes) with
/// `bounds` in force for what it lifts on this thread.
pub(super) fn with_bounds<R>(bounds: LiftBounds, call: impl FnOnce() -> R) -> R {
    let before = BOUNDS.replace(bounds);
    let result = call();
    BOUNDS.set(before);
    result
}

/// What a call of `process`, `expired` or `batch.finish` says of its record: its
/// outputs, or why it failed.
pub(super) type GuestResult = Result<GuestOutputs, GuestReason>;

/// A record's outputs as the guest returned them, checked against the bounds first.
#[derive(Debug, PartialEq)]
pub(super) enum GuestOutputs {
    /// Within the bounds: copied out of the guest's memory.
    Lifted(Vec<Output>),
    /// More outputs than the bounds allow: this many; none was read.
    TooMany(usize),
    /// Outputs whose keys, values and topics take this many bytes, past the bounds;
    /// only their lengths were read.
    TooLarge(usize),
}

/// The reason of a failed record (or of an `init` that refused to start), cut to the
/// bounds' `reason_bytes` when longer, with a note saying so.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GuestReason(pub String);

/// The canonical ABI layout of `output-record { key: list<u8>, value: list<u8>, topic:
/// option<string> }`: two pointer/length pairs, then the option's tag byte and, 4-aligned,
/// its string's pair. The WIT package never changes a record in place, and the type check
/// (against the bindings' `OutputRecord`) and the size assertion below hold it to this.
const OUTPUT_RECORD_SIZE: usize = 28;
const KEY_AT: usize = 0;
const VALUE_AT: usize = 8;
const TOPIC_TAG_AT: usize = 16;
const TOPIC_AT: usize = 20;
const _: () = assert!(<OutputRecord as ComponentType>::SIZE32 == OUTPUT_RECORD_SIZE);
const _: () = assert!(<OutputRecord as ComponentType>::ALIGN32 == 4);

/// The pointer/length pair of a list or string at `at` of `bytes`.
fn pair(bytes: &[u8], at: usize) -> (usize, usize) {
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
    (word(at), word(at + 4))
}

/// The pointer/length pair of a flattened list or string.
fn flat_pair(src: &[ValRaw; 2]) -> (usize, usize) {
    (src[0].get_u32() as usize, src[1].get_u32() as usize)
}

/// The `len` bytes of guest memory at `ptr`, or an error when they are not all inside it.
fn guest_bytes(memory: &[u8], ptr: usize, len: usize) -> wasmtime::Result<&[u8]> {
    match ptr.checked_add(len) {
        Some(end) if end <= memory.len() => Ok(&memory[ptr..end]),
        _ => bail!("the guest passed a list or string that is not inside its memory ({len} bytes at {ptr})"),
    }
}

/// Fails unless the component passes strings as UTF-8 (every Rust component does).
fn check_utf8_encoding(cx: &LiftContext<'_>) -> wasmtime::Result<()> {
    use wasmtime::component::__internal::wasmtime_environ::component::StringEncoding;
    if cx.options().string_encoding != StringEncoding::Utf8 {
        bail!("the component passes strings in {:?}; the host reads UTF-8 only", cx.options().string_encoding);
    }
    Ok(())
}

impl GuestOutputs {
    /// Reads the list of `len` output records at `ptr`, within the bounds.
    fn lift(cx: &LiftContext<'_>, ptr: usize, len: usize) -> wasmtime::Result<Self> {
        let bounds = BOUNDS.get();
        if len > bounds.outputs {
            return Ok(GuestOutputs::TooMany(len));
        }
        if !ptr.is_multiple_of(4) {
            bail!("the guest's list of outputs is not aligned to 4 bytes");
        }
        let memory = cx.memory();
        let records = guest_bytes(memory, ptr, len.saturating_mul(OUTPUT_RECORD_SIZE))?;
        // Lengths first: nothing is copied unless all of it fits.
        let mut parts = Vec::with_capacity(len);
        let mut total = 0usize;
        for record in records.chunks_exact(OUTPUT_RECORD_SIZE) {
            let (key_ptr, key_len) = pair(record, KEY_AT);
            let (value_ptr, value_len) = pair(record, VALUE_AT);
            let topic = match record[TOPIC_TAG_AT] {
                0 => None,
                1 => Some(pair(record, TOPIC_AT)),
                tag => bail!("the guest passed an option whose tag is {tag}, neither 0 nor 1"),
            };
            total = total.saturating_add(key_len).saturating_add(value_len);
            total = total.saturating_add(topic.map_or(0, |(_, len)| len));
            parts.push(((key_ptr, key_len), (value_ptr, value_len), topic));
        }
        if total > bounds.output_bytes {
            return Ok(GuestOutputs::TooLarge(total));
        }
        if parts.iter().any(|(_, _, topic)| topic.is_some()) {
            check_utf8_encoding(cx)?;
        }
        let mut outputs = Vec::with_capacity(len);
        for ((key_ptr, key_len), (value_ptr, value_len), topic) in parts {
            let topic = match topic {
                Some((ptr, len)) => Some(std::str::from_utf8(guest_bytes(memory, ptr, len)?)?.to_string()),
                None => None,
            };
            let key = guest_bytes(memory, key_ptr, key_len)?.to_vec();
            let value = guest_bytes(memory, value_ptr, value_len)?.to_vec();
            outputs.push(Output { key, value, topic });
        }
        Ok(GuestOutputs::Lifted(outputs))
    }
}

impl GuestReason {
    /// Reads the string of `len` bytes at `ptr`, cut to the bounds.
    fn lift(cx: &LiftContext<'_>, ptr: usize, len: usize) -> wasmtime::Result<Self> {
        check_utf8_encoding(cx)?;
        let limit = BOUNDS.get().reason_bytes;
        let bytes = guest_bytes(cx.memory(), ptr, len)?;
        if len <= limit {
            return Ok(GuestReason(std::str::from_utf8(bytes)?.to_string()));
        }
        // Cut at a character boundary: a character the cut splits goes whole.
        let kept = match std::str::from_utf8(&bytes[..limit]) {
            Ok(kept) => kept,
            Err(e) if e.error_len().is_none() => std::str::from_utf8(&bytes[..e.valid_up_to()])?,
            Err(e) => return Err(e.into()),
        };
        Ok(GuestReason(cut_note(kept, len - kept.len())))
    }
}

/// `reason`, made by the host (a trap's account), cut to `limit` bytes like a guest's.
pub(super) fn cut_reason(reason: String, limit: usize) -> String {
    if reason.len() <= limit {
        return reason;
    }
    let kept = &reason[..reason.floor_char_boundary(limit)];
    cut_note(kept, reason.len() - kept.len())
}

/// `kept`, followed by a note that `cut` more bytes were cut.
fn cut_note(kept: &str, cut: usize) -> String {
    format!("{kept}… ({cut} more bytes cut: [operator.limits] reason_bytes)")
}

// SAFETY (both impls): `Lower` and `ABI` are those of a list (a pointer/length pair), as
// `typecheck` requires the type to be, and the lifts read nothing but that pair and the
// guest memory it names, bounds-checked.
unsafe impl ComponentType for GuestOutputs {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <[OutputRecord] as ComponentType>::typecheck(ty, types)
    }
}

unsafe impl Lift for GuestOutputs {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        let (ptr, len) = flat_pair(src);
        GuestOutputs::lift(cx, ptr, len)
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, _ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        let (ptr, len) = pair(bytes, 0);
        GuestOutputs::lift(cx, ptr, len)
    }
}

unsafe impl ComponentType for GuestReason {
    type Lower = [ValRaw; 2];
    const ABI: CanonicalAbiInfo = CanonicalAbiInfo::POINTER_PAIR;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <str as ComponentType>::typecheck(ty, types)
    }
}

unsafe impl Lift for GuestReason {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        _ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        let (ptr, len) = flat_pair(src);
        GuestReason::lift(cx, ptr, len)
    }

    fn linear_lift_from_memory(cx: &mut LiftContext<'_>, _ty: InterfaceType, bytes: &[u8]) -> wasmtime::Result<Self> {
        let (ptr, len) = pair(bytes, 0);
        GuestReason::lift(cx, ptr, len)
    }
}
