//! The TCP echo upstream the tests put behind tunnels and proxies: each connection gets an
//! optional greeting (which upstream it reached), then every byte back until it closes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

/// Serves `listener` on a thread that ends with the test process, one thread per
/// connection: `on_connect` runs as each is accepted, `greeting` is written first (nothing if
/// empty), then whatever the peer sends is echoed until it closes or a write fails.
pub fn serve(listener: TcpListener, greeting: Vec<u8>, on_connect: impl Fn() + Send + 'static) {
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            on_connect();
            let greeting = greeting.clone();
            std::thread::spawn(move || {
                if greeting.is_empty() || conn.write_all(&greeting).is_ok() {
                    echo_until_closed(&mut conn);
                }
            });
        }
    });
}

/// Writes back whatever `conn` sends until it closes, a read fails (its timeout, say) or a
/// write fails.
pub fn echo_until_closed(conn: &mut TcpStream) {
    let mut buf = [0u8; 16384];
    loop {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
