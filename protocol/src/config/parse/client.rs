//! The client's directives: `http-proxy`, `http-proxy-option`, `pull-filter`,
//! `route-nopull`, `connect-retry`, `connect-retry-max`, `auth-nocache`.
//!
//! Most are refused in a server config; `pull-filter` is accepted there with a warning (as
//! upstream, which ignores it), `auth-nocache` without one.

use std::path::PathBuf;

use super::raw::{Raw, RawClient};
use super::{takes, Spec, NO_ARGS};
use crate::config::args::{bad, port, u32_arg, Args};
use crate::config::model::{
    ConnectRetry, CustomHeader, HttpProxy, HttpProxyOptions, ProxyAuth, ProxyAuthMethod,
    ProxyCredentials, DEFAULT_CONNECT_RETRY, MAX_CUSTOM_HTTP_HEADER,
};
use crate::config::ErrorReason;
use crate::push::{FilterAction, PullFilter};

pub(super) const DIRECTIVES: &[Spec] = &[
    Spec::new(
        "http-proxy",
        takes(2, 4, "HOST PORT [AUTHFILE|auto|auto-nct] [basic|ntlm2]"),
        http_proxy,
    )
    .client_only(),
    Spec::new(
        "http-proxy-option",
        takes(2, 3, "VERSION|AGENT|CUSTOM-HEADER VALUE..."),
        http_proxy_option,
    )
    .client_only(),
    Spec::new(
        "pull-filter",
        takes(2, 2, "accept|ignore|reject TEXT"),
        pull_filter,
    ),
    Spec::new("route-nopull", NO_ARGS, route_nopull).client_only(),
    Spec::new("connect-retry", takes(1, 2, "SECONDS [MAX]"), connect_retry).client_only(),
    Spec::new("connect-retry-max", takes(1, 1, "N"), connect_retry_max).client_only(),
    Spec::new("auth-nocache", NO_ARGS, auth_nocache),
];

/// `http-proxy HOST PORT [CREDENTIALS [METHOD]]`.
fn http_proxy(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let auth = match a.opt(2) {
        None => None,
        Some(credentials) => Some(proxy_auth(credentials, a.opt(3))?),
    };
    raw.client.http_proxy = Some(HttpProxy {
        host: a.s(0).to_owned(),
        port: port(a.s(1))?,
        auth,
    });
    Ok(())
}

/// The credentials (a file, or `auto` / `auto-nct`) and the method of `http-proxy`.
fn proxy_auth(credentials: &str, method: Option<&str>) -> Result<ProxyAuth, ErrorReason> {
    let credentials = match credentials {
        "auto" => ProxyCredentials::Auto,
        "auto-nct" => ProxyCredentials::AutoNct,
        f => ProxyCredentials::File(PathBuf::from(f)),
    };
    let method = match method {
        None => None,
        Some("basic") => Some(ProxyAuthMethod::Basic),
        Some("ntlm2") => Some(ProxyAuthMethod::Ntlm2),
        Some(v) => return Err(bad(v, "basic or ntlm2")),
    };
    Ok(ProxyAuth {
        credentials,
        method,
    })
}

/// `http-proxy-option VERSION 1.0|1.1`, `AGENT STRING`, or a custom header (`CUSTOM-HEADER`,
/// or upstream's older `EXT1` / `EXT2`), at most [`MAX_CUSTOM_HTTP_HEADER`] of them.
fn http_proxy_option(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let o = &mut raw.client.http_proxy_options;
    match a.s(0) {
        "VERSION" => {
            a.count(2, 2, "VERSION 1.0|1.1")?;
            match a.s(1) {
                "1.0" | "1.1" => o.version = Some(a.s(1).to_owned()),
                v => return Err(bad(v, "1.0 or 1.1")),
            }
        }
        "AGENT" => {
            a.count(2, 2, "AGENT STRING")?;
            o.agent = Some(a.s(1).to_owned());
        }
        "CUSTOM-HEADER" | "EXT1" | "EXT2" => add_custom_header(
            o,
            CustomHeader {
                name: a.s(1).to_owned(),
                content: a.opt(2).map(str::to_owned),
            },
        )?,
        v => return Err(bad(v, "VERSION, AGENT, CUSTOM-HEADER, EXT1 or EXT2")),
    }
    Ok(())
}

/// One more custom header, at most [`MAX_CUSTOM_HTTP_HEADER`].
pub(super) fn add_custom_header(
    o: &mut HttpProxyOptions,
    header: CustomHeader,
) -> Result<(), ErrorReason> {
    if o.custom_headers.len() >= MAX_CUSTOM_HTTP_HEADER {
        return Err(ErrorReason::TooMany {
            max: MAX_CUSTOM_HTTP_HEADER,
        });
    }
    o.custom_headers.push(header);
    Ok(())
}

/// `pull-filter accept|ignore|reject TEXT`, kept in config order.
fn pull_filter(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let action = match a.s(0) {
        "accept" => FilterAction::Accept,
        "ignore" => FilterAction::Ignore,
        "reject" => FilterAction::Reject,
        v => return Err(bad(v, "accept, ignore or reject")),
    };
    add_pull_filter(&mut raw.client, PullFilter::new(action, a.s(1)), a.line());
    Ok(())
}

/// One more filter; the first one's line is kept (a server warns about it).
pub(super) fn add_pull_filter(client: &mut RawClient, filter: PullFilter, line: usize) {
    let filters = client
        .pull_filters
        .get_or_insert_with(|| (Vec::new(), line));
    filters.0.push(filter);
}

fn route_nopull(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.client.route_nopull = true;
    Ok(())
}

/// `connect-retry SECONDS [MAX]`: MAX defaults to upstream's 300 s.
fn connect_retry(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    let initial = u32_arg(a.s(0))?;
    let max = a
        .opt(1)
        .map(u32_arg)
        .transpose()?
        .unwrap_or(DEFAULT_CONNECT_RETRY.max);
    raw.client.connect_retry = Some(ConnectRetry { initial, max });
    Ok(())
}

fn connect_retry_max(raw: &mut Raw, a: &Args<'_>) -> Result<(), ErrorReason> {
    raw.client.connect_retry_max = Some(u32_arg(a.s(0))?);
    Ok(())
}

fn auth_nocache(raw: &mut Raw, _: &Args<'_>) -> Result<(), ErrorReason> {
    raw.client.auth_nocache = true;
    Ok(())
}
