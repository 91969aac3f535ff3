//! Free loopback ports, for servers a test starts or tells a child process to listen on.

use std::net::{SocketAddr, TcpListener};

use anyhow::Result;

/// A loopback address whose port was free a moment ago (the OS hands out ports in turn, so it
/// stays free long enough for the test to bind it).
pub fn free_addr() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The port of [`free_addr`].
pub fn free_port() -> Result<u16> {
    Ok(free_addr()?.port())
}
