//! The randomness a session is built with.
//!
//! A session draws on its generator for session ids, key-method-2 randoms and, with a CBC
//! data cipher, one IV per packet. `OsRng` would make each of those a `getrandom(2)` system
//! call; a ChaCha20 generator seeded from the OS once per session gives the same
//! unpredictability without one (upstream OpenVPN likewise uses OpenSSL's DRBG).

use rand_chacha::ChaCha20Rng;
use rand_core::{CryptoRngCore, SeedableRng};

/// A ChaCha20 CSPRNG seeded from the operating system, for one session. Panics if the OS
/// has no randomness to give (`getrandom(2)` failing), where no session could be secure.
pub fn session_rng() -> Box<dyn CryptoRngCore + Send> {
    Box::new(ChaCha20Rng::from_entropy())
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_sessions_draw_different_bytes() {
        let (mut a, mut b) = (super::session_rng(), super::session_rng());
        let (mut x, mut y) = ([0u8; 32], [0u8; 32]);
        a.fill_bytes(&mut x);
        b.fill_bytes(&mut y);
        assert_ne!(x, y);
    }
}
