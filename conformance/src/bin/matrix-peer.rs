//! `matrix-peer server|client --config FILE`: our `vpn-server` or `vpn-client` as one
//! program for the conformance matrix (`tests/matrix.rs`).
//!
//! It does what the two binaries' `main` do for a config file (load it, log to stderr at
//! `info`, run until SIGTERM/SIGINT), through the same library entry points
//! ([`vpn_server::load_file`] + [`vpn_server::Server`], [`vpn_client::config::load`] +
//! [`vpn_client::run`]). Being a binary of this package, cargo builds it fresh for the matrix
//! test (`CARGO_BIN_EXE_matrix-peer`); the real binaries belong to other packages and are
//! not guaranteed to be built, or current, when only the matrix runs. `up`/`down` scripts are
//! not run (the matrix configs have none).
//!
//! `MATRIX_PEER_TLS_EKM=0` turns off the TLS keying-material exporter (no config directive
//! does), so the matrix can prove the PRF key derivation against upstream.

use std::path::PathBuf;
use std::process::ExitCode;

use netio::report::chain;
use netio::signals::cancel_on_signals;
use vpn_client::CancellationToken;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (role, path) = match args.as_slice() {
        [role, flag, path] if flag == "--config" => (role.as_str(), PathBuf::from(path)),
        _ => {
            eprintln!("usage: matrix-peer server|client --config FILE");
            return ExitCode::FAILURE;
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let result = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(async {
            let token = CancellationToken::new();
            match cancel_on_signals(token.clone()) {
                Ok(watch) => drop(tokio::spawn(watch)),
                Err(e) => return Err(e.into()),
            }
            match role {
                "server" => server(path, token).await,
                "client" => client(path, token).await,
                other => Err(format!("unknown role {other:?}").into()),
            }
        }),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("matrix-peer {role}: error: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error>;

async fn server(path: PathBuf, token: CancellationToken) -> Result<(), BoxError> {
    let mut loaded = vpn_server::load_file(&path)?;
    loaded.settings.tls_ekm = ekm_wanted();
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    let server = vpn_server::Server::bind(loaded.settings).await?;
    tracing::info!("Initialization Sequence Completed");
    server.run(token).await?;
    Ok(())
}

async fn client(path: PathBuf, token: CancellationToken) -> Result<(), BoxError> {
    let mut loaded = vpn_client::config::load(&path)?;
    loaded.settings.tls_ekm = ekm_wanted();
    for w in &loaded.warnings {
        tracing::warn!("{w}");
    }
    match vpn_client::run(loaded.settings, token).await? {
        vpn_client::Stopped::Shutdown => Ok(()),
        vpn_client::Stopped::Halted { message } => {
            Err(format!("the server halted the client: {message}").into())
        }
    }
}

fn ekm_wanted() -> bool {
    std::env::var("MATRIX_PEER_TLS_EKM").map_or(true, |v| v != "0")
}
