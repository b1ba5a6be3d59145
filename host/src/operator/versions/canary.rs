//! A canary: a second version beside the active one, taking a share of each
//! partition's keys — their records, expiries and timers — by a hash of the key, so
//! every host agrees which keys are its. This says which keys; a partition's
//! [`VersionedInstance`](super::VersionedInstance) pairs the canary's instance with the
//! active version's and hands the sandbox the route ([`KeyRoute`]), which carries it out.

use crate::operator::BasisPoints;
use crate::operator::wasm::KeyRoute;
use std::sync::Arc;

/// Whether a canary holding `share` of the keys processes `key`: FNV-1a (64 bits) of the
/// key's bytes, modulo 10,000, is below the share. The same key always lands in the same
/// place, so raising a canary's share only adds keys to it, and every host agrees.
pub fn in_canary(key: &[u8], share: BasisPoints) -> bool {
    crate::record::key_hash(key) % 10_000 < u64::from(share)
}

/// The route of a canary holding `share` of the keys.
pub(super) fn route(share: BasisPoints) -> KeyRoute {
    Arc::new(move |key| in_canary(key, share))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key a canary takes at a share it takes at every larger one, and the shares
    /// split keys about as they say.
    #[test]
    fn a_canary_keeps_its_keys_as_its_share_grows() {
        let keys: Vec<Vec<u8>> = (0..20_000).map(|i| format!("veh-{i:05}").into_bytes()).collect();
        let taken = |share| keys.iter().filter(|key| in_canary(key, share)).count();
        for key in &keys {
            let shares = [100, 1000, 5000, 10_000].map(|share| in_canary(key, share));
            assert!(shares.windows(2).all(|w| !w[0] || w[1]), "{shares:?}");
        }
        assert!((1_700..2_300).contains(&taken(1000)), "{}", taken(1000));
        assert_eq!(taken(10_000), keys.len());
    }
}
