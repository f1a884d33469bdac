//! Log set-up shared by every binary (`vpn-server`, `vpn-client`, `vpn-router`).
//!
//! The filter is a comma-separated list of `LEVEL` and `target=LEVEL` directives, e.g. `info`
//! or `info,vpn_server=debug`, parsed by tracing's [`Targets`]. Unlike `EnvFilter` it needs no
//! regex engine, which keeps about 0.3 MB of program text (and its resident pages) out of the
//! binary; span and field directives (`target[span]=level`) are not supported and are refused.

use tracing_subscriber::filter::{ParseError, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Installs the global subscriber: formatted lines on stderr (ANSI colours on a terminal),
/// filtered by `filter`. Fails when `filter` does not parse.
pub fn init(filter: &str) -> Result<(), ParseError> {
    tracing_subscriber::registry()
        .with(parse(filter)?)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    Ok(())
}

/// Parses a `--log` filter: `LEVEL` and `target=LEVEL` directives separated by commas.
pub fn parse(filter: &str) -> Result<Targets, ParseError> {
    filter.parse()
}

#[cfg(test)]
mod tests {
    use super::parse;
    use tracing::Level;

    #[test]
    fn the_filters_users_write_still_parse() {
        let t = parse("info").unwrap();
        assert!(t.would_enable("vpn_server::server", &Level::INFO));
        assert!(!t.would_enable("vpn_server::server", &Level::DEBUG));
        assert!(t.would_enable("netio", &Level::WARN));

        let t = parse("info,vpn_server=debug").unwrap();
        assert!(t.would_enable("vpn_server::server", &Level::DEBUG));
        assert!(!t.would_enable("vpn_server::server", &Level::TRACE));
        assert!(!t.would_enable("netio", &Level::DEBUG));
        assert!(t.would_enable("netio", &Level::INFO));

        // Only a target: nothing else is logged.
        let t = parse("vpn_server=trace").unwrap();
        assert!(t.would_enable("vpn_server::router", &Level::TRACE));
        assert!(!t.would_enable("netio", &Level::ERROR));
    }

    #[test]
    fn a_malformed_filter_is_refused() {
        assert!(parse("info,vpn_server=loud").is_err());
        assert!(parse("vpn_server[conn{peer=1}]=debug").is_err());
    }
}
