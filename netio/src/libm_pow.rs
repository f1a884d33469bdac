//! `pow(3)` inside the program, so the binaries do not load the C math library.
//!
//! The only libm function our binaries call is `pow`: tokio's multi-thread scheduler uses
//! `f64::powf` for its task poll-time average. Resolved by `libm.so.6`, that one call maps the
//! whole library into every process: about 0.5 MiB of resident memory of an idle `vpn-server`
//! (measured; see "Idle memory" in `docs/performance-notes.md`). Defined in the program, `pow`
//! is resolved there and, as Rust links with `--as-needed`, `libm.so.6` is left out. The
//! arithmetic is the `libm` crate's (the Rust port of musl's math library).
//!
//! Only a binary should define it, with one line at the top level of its `main.rs`:
//! `netio::libm_pow!();`. A library that defined it would replace `pow` for every program
//! linking it, tests included. `ldd target/release/vpn-server` then lists no `libm`.

/// Defines `double pow(double x, double y)` (C's math library semantics) in the invoking
/// crate; see the module docs. On targets other than Linux with glibc it expands to nothing.
#[macro_export]
macro_rules! libm_pow {
    () => {
        /// `double pow(double x, double y)`, as C's math library defines it: takes the place
        /// of libm's (`netio::libm_pow`).
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // Not unsafe to call; the lint flags any unmangled symbol because it could clash with
        // another definition. This one is meant to take the place of libm's (same signature
        // and semantics), and nothing else in the program defines `pow`.
        #[allow(unsafe_code)]
        #[no_mangle]
        pub extern "C" fn pow(x: f64, y: f64) -> f64 {
            $crate::libm_pow::libm_pow(x, y)
        }
    };
}

/// The arithmetic behind [`libm_pow!`](crate::libm_pow!).
#[doc(hidden)]
pub fn libm_pow(x: f64, y: f64) -> f64 {
    libm::pow(x, y)
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    // The test binary gets the definition the binaries get, so `pow` below is the symbol
    // the C library would otherwise resolve.
    crate::libm_pow!();

    /// Expected values from glibc's `pow` (Python 3's `math.pow` on this machine, which calls
    /// the system libm; `float.hex` for the exact bits). Not `f64::powf`: in this test binary
    /// that would call the function under test.
    #[test]
    fn matches_glibc_on_tokio_like_inputs_and_edge_cases() {
        for (x, y, expected) in [
            // The scheduler raises (1 - alpha) to a tasks-per-batch count.
            (0.9_f64, 61.0_f64, 0.0016173092699229906_f64),
            (1.0001, 10000.0, 2.7181459268249255),
            (0.5, 0.5, std::f64::consts::FRAC_1_SQRT_2),
            (2.0, -3.0, 0.125),
            (10.0, 308.0, 1e308),
            (0.0, 0.0, 1.0),
        ] {
            let ours = pow(x, y);
            assert_eq!(
                ours.to_bits(),
                expected.to_bits(),
                "pow({x}, {y}) = {ours}, want {expected}"
            );
        }
        assert!(pow(-8.0, 1.0 / 3.0).is_nan());
        assert_eq!(pow(2.0, 1024.0), f64::INFINITY);
    }
}
