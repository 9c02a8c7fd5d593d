//! The control socket between the agent and one worker: a `SOCK_SEQPACKET` pair whose
//! messages are small JSON records, some carrying one file descriptor (`SCM_RIGHTS`):
//! the staging memfd with [`Control::Hello`], a new channel with [`Control::Channel`], a
//! host region's file with [`Control::HostMemory`].

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

use crate::wire::{Setup, WireError};

/// The largest control message (a setup record is well under a kilobyte).
const MAX_CONTROL_BYTES: usize = 64 << 10;

#[derive(Debug, Serialize, Deserialize)]
pub enum Control {
    /// Agent to worker, first: the backend's settings; carries the staging memfd.
    Hello(Setup),
    /// Worker to agent: the backend is open, channels may come.
    Ready,
    /// Worker to agent: the backend could not be opened; the worker exits.
    Failed(WireError),
    /// Agent to worker: serve requests on the stream socket this carries.
    Channel,
    /// Agent to worker: map `len` bytes from `offset` of the host region's file this
    /// carries, as region `id` ([`crate::host`]); answered with [`Control::HostMapped`].
    HostMemory { id: u64, offset: u64, len: u64 },
    /// Worker to agent: region `id` is mapped, or why it could not be.
    HostMapped { id: u64, error: Option<String> },
    /// Agent to worker: region `id` was given back; unmap it (no answer).
    ForgetHostMemory { id: u64 },
}

/// The two ends of a new control socket pair (close-on-exec).
pub fn pair() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Send `message`, with `fd` attached if given.
pub fn send(socket: BorrowedFd<'_>, message: &Control, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let body = serde_json::to_vec(message).map_err(io::Error::other)?;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        if !ancillary.push(SendAncillaryMessage::ScmRights(&fds)) {
            return Err(io::Error::other("no room for a descriptor in a control message"));
        }
    }
    let sent = rustix::net::sendmsg(socket, &[IoSlice::new(&body)], &mut ancillary, SendFlags::NOSIGNAL)?;
    if sent != body.len() {
        return Err(io::Error::other(format!("control message cut short: {sent} of {} bytes", body.len())));
    }
    Ok(())
}

/// Receive a message and the descriptor it carries, if any; `UnexpectedEof` when the
/// other side closed its end.
pub fn recv(socket: BorrowedFd<'_>) -> io::Result<(Control, Option<OwnedFd>)> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let mut body = vec![0u8; MAX_CONTROL_BYTES];
    let got = rustix::net::recvmsg(socket, &mut [IoSliceMut::new(&mut body)], &mut ancillary, RecvFlags::CMSG_CLOEXEC)?;
    let mut fd = None;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for received in fds {
                fd.get_or_insert(received);
            }
        }
    }
    if got.bytes == 0 {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the other end of the control socket is gone"));
    }
    let message = serde_json::from_slice(&body[..got.bytes])
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("malformed control message: {e}")))?;
    Ok((message, fd))
}
