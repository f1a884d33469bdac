//! One line for an error and its causes: what every binary prints before it exits and what
//! the drivers put into a log field.

use std::error::Error;

/// The error and its causes, `: `-separated on one line. A cause whose text the line already
/// holds (an error that prints its source itself) is left out, and line breaks become spaces.
pub fn chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out.replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot open {path}")]
    struct Open {
        path: &'static str,
        #[source]
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("startup failed: {0}")]
    struct Repeats(#[source] std::io::Error);

    #[test]
    fn causes_are_joined_once_on_one_line() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such\nfile");
        let e = Open {
            path: "/x",
            source: io(),
        };
        assert_eq!(chain(&e), "cannot open /x: no such file");
        // The cause is already in the message: not printed twice.
        assert_eq!(chain(&Repeats(io())), "startup failed: no such file");
    }
}
