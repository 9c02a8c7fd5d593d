//! One data plane chosen at run time: UCX or libfabric behind the same
//! [`Transport`] traits, so the agent and the shim name no provider's types.
//!
//! [`Worker`], [`Region`], [`Endpoint`] and [`RemoteKey`] are enums over the
//! [`crate::ucx`] and [`crate::ofi`] handles; every call is one `match` and goes
//! straight to the provider (no boxing, no extra lock). A region, key or endpoint of
//! one provider used with another's is refused with [`Error::MixedProviders`]: that
//! is a bug in the caller, not something a peer can cause (keys are unpacked on the
//! endpoint that will use them).
//!
//! [`Spec`] names what to open, in the words users type: `ucx-shm`, `ucx-tcp`,
//! `ofi-shm`, `ofi-tcp` (see [`Spec::CHOICES`]), plus `ucx-auto` and `ofi-verbs`.
//!
//! With the `testing` feature each enum has a third variant, `LoopbackForTests`, over
//! the in-process test double `crate::testing`, so code that holds these enums runs
//! unchanged in its unit tests. No [`Spec`] opens it: tests build it themselves.

use std::ops::{Deref, DerefMut};
use std::os::fd::RawFd;
use std::time::Duration;

use crate::doorbell::Doorbell;
use crate::error::{Error, Result};
use crate::memory::{MappedRemote, SharedMemory};
use crate::ofi::{self, OfiConfig};
#[cfg(feature = "testing")]
use crate::testing;
use crate::transport;
use crate::ucx;
use crate::{FabricConfig, Transport};

/// `"ucx"`: the provider name of UCX workers (`TransportInfo.provider`).
pub const UCX: &str = "ucx";
/// `"ofi"`: the provider name of libfabric workers (`TransportInfo.provider`).
pub const OFI: &str = "ofi";

/// What to open: a UCX worker with its transports, or a libfabric worker on one
/// provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    Ucx(FabricConfig),
    Ofi(OfiConfig),
}

impl Spec {
    /// The names [`Spec::parse`] accepts for the four data planes this crate tests.
    pub const CHOICES: &'static [&'static str] = &["ucx-shm", "ucx-tcp", "ofi-shm", "ofi-tcp"];

    /// `ucx-shm`, `ucx-tcp`, `ucx-auto` (UCX chooses: rc/dc on RDMA NICs),
    /// `ofi-shm`, `ofi-tcp`, `ofi-verbs` (untested here). `None` for anything else.
    pub fn parse(name: &str) -> Option<Spec> {
        let (provider, transport) = name.split_once('-')?;
        match provider {
            UCX => FabricConfig::preset(transport).map(Spec::Ucx),
            OFI => {
                let provider = match transport {
                    "shm" => ofi::SHM_PROVIDER,
                    "tcp" => ofi::TCP_PROVIDER,
                    "verbs" => ofi::VERBS_PROVIDER,
                    _ => return None,
                };
                OfiConfig::preset(provider).map(Spec::Ofi)
            }
            _ => None,
        }
    }

    /// [`UCX`] or [`OFI`].
    pub fn provider(&self) -> &'static str {
        match self {
            Spec::Ucx(_) => UCX,
            Spec::Ofi(_) => OFI,
        }
    }

    /// This spec with its network traffic on the interface `name` (as `ip link` names
    /// it), for machines with several, or peers in other network namespaces: UCX's
    /// `NET_DEVICES` (which also leaves out RDMA devices: name the interface on TCP
    /// set-ups only), and for libfabric tcp the domain, whose names are interface
    /// names. UCX's shared-memory preset, libfabric shm and verbs carry no traffic over
    /// a network interface and are returned unchanged. Whether the interface exists is
    /// [`crate::config::check_interface`]'s to say.
    pub fn on_interface(self, name: &str) -> Spec {
        match self {
            Spec::Ucx(mut c) if c.transports.as_deref() != Some(crate::SHM_TRANSPORTS) => {
                c.ucx_options.retain(|(option, _)| option != "NET_DEVICES");
                c.ucx_options.push(("NET_DEVICES".into(), name.to_owned()));
                Spec::Ucx(c)
            }
            Spec::Ofi(mut c) if c.provider == ofi::TCP_PROVIDER => {
                c.domain = Some(name.to_owned());
                Spec::Ofi(c)
            }
            other => other,
        }
    }

    /// What distinguishes workers of one provider that cannot talk to each other:
    /// the libfabric provider name (`"shm"`, `"tcp;ofi_rxm"`); empty for UCX, whose
    /// worker addresses carry every transport it may use.
    pub fn fabric_provider(&self) -> &str {
        match self {
            Spec::Ucx(_) => "",
            Spec::Ofi(c) => &c.provider,
        }
    }
}

/// A UCX or libfabric worker ([`Transport`]). Cheap to clone (a handle).
#[derive(Clone)]
pub enum Worker {
    Ucx(ucx::Worker),
    Ofi(ofi::Worker),
    /// The in-process test double (`testing` feature only; never in product code).
    #[cfg(feature = "testing")]
    LoopbackForTests(testing::LoopbackWorker),
}

/// Local memory registered with a [`Worker`].
#[derive(Debug)]
pub enum Region {
    Ucx(ucx::Region),
    Ofi(ofi::Region),
    /// See [`Worker::LoopbackForTests`].
    #[cfg(feature = "testing")]
    LoopbackForTests(testing::LoopbackRegion),
}

/// A connection from a [`Worker`] to one peer.
#[derive(Clone, Debug)]
pub enum Endpoint {
    Ucx(ucx::Endpoint),
    Ofi(ofi::Endpoint),
    /// See [`Worker::LoopbackForTests`].
    #[cfg(feature = "testing")]
    LoopbackForTests(testing::LoopbackEndpoint),
}

/// A peer region's key, unpacked on an [`Endpoint`].
#[derive(Clone, Debug)]
pub enum RemoteKey {
    Ucx(ucx::RemoteKey),
    Ofi(ofi::RemoteKey),
    /// See [`Worker::LoopbackForTests`].
    #[cfg(feature = "testing")]
    LoopbackForTests(testing::LoopbackRemoteKey),
}

/// Calls the same method on whichever provider's handle `$value` holds.
macro_rules! each {
    ($value:expr, $h:ident => $call:expr) => {
        match $value {
            Self::Ucx($h) => $call,
            Self::Ofi($h) => $call,
            #[cfg(feature = "testing")]
            Self::LoopbackForTests($h) => $call,
        }
    };
}

impl Worker {
    /// Opens a worker as `spec` says.
    pub fn open(spec: &Spec) -> Result<Worker> {
        Ok(match spec {
            Spec::Ucx(c) => Worker::Ucx(ucx::Worker::open(c)?),
            Spec::Ofi(c) => Worker::Ofi(ofi::Worker::open(c)?),
        })
    }

    /// [`UCX`] or [`OFI`].
    pub fn provider(&self) -> &'static str {
        match self {
            Worker::Ucx(_) => UCX,
            Worker::Ofi(_) => OFI,
            #[cfg(feature = "testing")]
            Worker::LoopbackForTests(_) => testing::PROVIDER,
        }
    }

    /// See [`Spec::fabric_provider`].
    pub fn fabric_provider(&self) -> &str {
        match self {
            Worker::Ucx(_) => "",
            Worker::Ofi(w) => &w.config().provider,
            #[cfg(feature = "testing")]
            Worker::LoopbackForTests(_) => "",
        }
    }

    /// What the provider chose (transports, devices, completion semantics), for logs.
    pub fn describe(&self) -> String {
        match self {
            Worker::Ucx(w) => w.context().describe(),
            Worker::Ofi(w) => w.describe(),
            #[cfg(feature = "testing")]
            Worker::LoopbackForTests(w) => w.describe(),
        }
    }

    /// The provider's loaded modules where it has them (UCX's components, e.g. `self,
    /// tcp, sysv, posix, ib, rdmacm, cma`); empty for libfabric, whose providers are
    /// chosen by name.
    pub fn modules(&self) -> Vec<String> {
        match self {
            Worker::Ucx(w) => w.context().components(),
            _ => Vec::new(),
        }
    }

    /// Doorbells that arrived malformed (wrong size) and were dropped.
    pub fn malformed_doorbells(&self) -> u64 {
        each!(self, w => w.malformed_doorbells())
    }

    /// Registers memory lent by someone else (a backend's staging memory that another
    /// process fills), so this worker's puts and gets may use it like a region it
    /// allocated; the registration holds `memory` until it goes. Peers cannot attach
    /// such memory on shared-memory transports: it is for this process's own transfers.
    pub fn register_lent(&self, memory: std::sync::Arc<dyn host_bytes::LentMemory>) -> Result<Region> {
        let (ptr, len) = memory.span();
        let keep: std::sync::Arc<dyn std::any::Any + Send + Sync> = std::sync::Arc::new(memory);
        // LentMemory's contract keeps the span mapped while the memory lives, and
        // `keep` holds it for as long as the registration.
        Ok(match self {
            // SAFETY: as above.
            Worker::Ucx(w) => Region::Ucx(unsafe { w.context().register_lent(ptr, len, keep) }?),
            // SAFETY: as above.
            Worker::Ofi(w) => Region::Ofi(unsafe { w.register_lent(ptr, len, keep) }?),
            #[cfg(feature = "testing")]
            // SAFETY: as above.
            Worker::LoopbackForTests(w) => Region::LoopbackForTests(unsafe { w.register_lent(ptr, len, keep) }?),
        })
    }
}

impl Transport for Worker {
    type Region = Region;
    type Endpoint = Endpoint;

    fn name(&self) -> &'static str {
        self.provider()
    }
    fn alloc_region(&self, len: usize) -> Result<Region> {
        Ok(match self {
            Worker::Ucx(w) => Region::Ucx(w.alloc_region(len)?),
            Worker::Ofi(w) => Region::Ofi(w.alloc_region(len)?),
            #[cfg(feature = "testing")]
            Worker::LoopbackForTests(w) => Region::LoopbackForTests(w.alloc_region(len)?),
        })
    }
    fn address(&self) -> Result<Vec<u8>> {
        each!(self, w => w.address())
    }
    fn connect(&self, peer_address: &[u8]) -> Result<Endpoint> {
        Ok(match self {
            Worker::Ucx(w) => Endpoint::Ucx(w.connect(peer_address)?),
            Worker::Ofi(w) => Endpoint::Ofi(w.connect(peer_address)?),
            #[cfg(feature = "testing")]
            Worker::LoopbackForTests(w) => Endpoint::LoopbackForTests(w.connect(peer_address)?),
        })
    }
    fn progress(&self) -> usize {
        each!(self, w => w.progress())
    }
    fn event_fd(&self) -> Result<RawFd> {
        each!(self, w => w.event_fd())
    }
    fn arm(&self) -> Result<bool> {
        each!(self, w => w.arm())
    }
    fn wake(&self) -> Result<()> {
        each!(self, w => w.wake())
    }
    fn wakes_on_receive(&self) -> bool {
        each!(self, w => Transport::wakes_on_receive(w))
    }
    fn take_doorbells(&self, out: &mut Vec<Doorbell>) -> u64 {
        each!(self, w => w.take_doorbells(out))
    }
}

impl Deref for Region {
    type Target = SharedMemory;
    fn deref(&self) -> &SharedMemory {
        each!(self, r => r)
    }
}

impl DerefMut for Region {
    fn deref_mut(&mut self) -> &mut SharedMemory {
        each!(self, r => r)
    }
}

impl transport::Region for Region {
    fn packed_key(&self) -> Result<Vec<u8>> {
        each!(self, r => r.packed_key())
    }
}

impl transport::RemoteKey for RemoteKey {
    fn remote_addr(&self) -> u64 {
        each!(self, k => k.remote_addr())
    }
    fn len(&self) -> u64 {
        each!(self, k => k.len())
    }
    /// Always `None` on libfabric.
    fn map(&self, remote_addr: u64, len: usize) -> Result<Option<MappedRemote>> {
        each!(self, k => k.map(remote_addr, len))
    }
}

fn mixed(what: &'static str) -> Error {
    Error::MixedProviders { what }
}

impl transport::Endpoint for Endpoint {
    type Region = Region;
    type RemoteKey = RemoteKey;

    fn unpack_key(&self, packed: &[u8], remote_addr: u64, len: u64) -> Result<RemoteKey> {
        Ok(match self {
            Endpoint::Ucx(e) => RemoteKey::Ucx(e.unpack_key(packed, remote_addr, len)?),
            Endpoint::Ofi(e) => RemoteKey::Ofi(e.unpack_key(packed, remote_addr, len)?),
            #[cfg(feature = "testing")]
            Endpoint::LoopbackForTests(e) => RemoteKey::LoopbackForTests(e.unpack_key(packed, remote_addr, len)?),
        })
    }
    fn put(&self, local: &Region, local_offset: usize, len: usize, remote_addr: u64, key: &RemoteKey) -> Result<()> {
        match (self, local, key) {
            (Endpoint::Ucx(e), Region::Ucx(r), RemoteKey::Ucx(k)) => e.put(r, local_offset, len, remote_addr, k),
            (Endpoint::Ofi(e), Region::Ofi(r), RemoteKey::Ofi(k)) => e.put(r, local_offset, len, remote_addr, k),
            #[cfg(feature = "testing")]
            (Endpoint::LoopbackForTests(e), Region::LoopbackForTests(r), RemoteKey::LoopbackForTests(k)) => {
                e.put(r, local_offset, len, remote_addr, k)
            }
            _ => Err(mixed("put: the local region or the remote key")),
        }
    }
    fn put_bytes(&self, data: &[u8], remote_addr: u64, key: &RemoteKey) -> Result<()> {
        match (self, key) {
            (Endpoint::Ucx(e), RemoteKey::Ucx(k)) => e.put_bytes(data, remote_addr, k),
            (Endpoint::Ofi(e), RemoteKey::Ofi(k)) => e.put_bytes(data, remote_addr, k),
            #[cfg(feature = "testing")]
            (Endpoint::LoopbackForTests(e), RemoteKey::LoopbackForTests(k)) => e.put_bytes(data, remote_addr, k),
            _ => Err(mixed("put_bytes: the remote key")),
        }
    }
    fn get(&self, local: &Region, local_offset: usize, len: usize, remote_addr: u64, key: &RemoteKey) -> Result<()> {
        match (self, local, key) {
            (Endpoint::Ucx(e), Region::Ucx(r), RemoteKey::Ucx(k)) => e.get(r, local_offset, len, remote_addr, k),
            (Endpoint::Ofi(e), Region::Ofi(r), RemoteKey::Ofi(k)) => e.get(r, local_offset, len, remote_addr, k),
            #[cfg(feature = "testing")]
            (Endpoint::LoopbackForTests(e), Region::LoopbackForTests(r), RemoteKey::LoopbackForTests(k)) => {
                e.get(r, local_offset, len, remote_addr, k)
            }
            _ => Err(mixed("get: the local region or the remote key")),
        }
    }
    fn flush(&self, timeout: Duration) -> Result<()> {
        each!(self, e => e.flush(timeout))
    }
    fn send_doorbell(&self, bytes: &[u8]) -> Result<()> {
        each!(self, e => e.send_doorbell(bytes))
    }
    fn describe(&self) -> String {
        each!(self, e => e.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_the_names_users_type() {
        for name in Spec::CHOICES {
            assert!(Spec::parse(name).is_some(), "{name}");
        }
        assert_eq!(Spec::parse("ucx-shm"), Some(Spec::Ucx(FabricConfig::shm())));
        assert_eq!(Spec::parse("ofi-tcp").unwrap().fabric_provider(), ofi::TCP_PROVIDER);
        assert_eq!(Spec::parse("ofi-shm").unwrap().provider(), OFI);
        for bad in ["", "ucx", "shm", "ofi-", "ofi-ucx", "verbs-ofi", "ucx-posix"] {
            assert_eq!(Spec::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn on_interface_restricts_the_network_transports_only() {
        let spec = |name: &str| Spec::parse(name).unwrap().on_interface("veth0");
        let Spec::Ucx(tcp) = spec("ucx-tcp") else { panic!("ucx") };
        assert_eq!(tcp.ucx_options, vec![("NET_DEVICES".to_owned(), "veth0".to_owned())]);
        // Once, even when applied twice.
        let Spec::Ucx(twice) = Spec::Ucx(tcp).on_interface("veth1") else { panic!("ucx") };
        assert_eq!(twice.ucx_options, vec![("NET_DEVICES".to_owned(), "veth1".to_owned())]);
        let Spec::Ucx(auto) = spec("ucx-auto") else { panic!("ucx") };
        assert_eq!(auto.ucx_options.len(), 1);
        let Spec::Ofi(ofi_tcp) = spec("ofi-tcp") else { panic!("ofi") };
        assert_eq!(ofi_tcp.domain.as_deref(), Some("veth0"));
        for unchanged in ["ucx-shm", "ofi-shm", "ofi-verbs"] {
            assert_eq!(spec(unchanged), Spec::parse(unchanged).unwrap(), "{unchanged}");
        }
    }

    #[test]
    fn handles_of_two_providers_do_not_mix() {
        use transport::Endpoint as _;
        let ucx = Worker::open(&Spec::parse("ucx-shm").unwrap()).unwrap();
        let ofi = match Worker::open(&Spec::parse("ofi-shm").unwrap()) {
            Ok(w) => w,
            Err(e) => return eprintln!("skipped: libfabric shm unavailable here: {e}"),
        };
        let target = ucx.alloc_region(4096).unwrap();
        let ep = ucx.connect(&ucx.address().unwrap()).unwrap();
        let key = ep.unpack_key(&transport::Region::packed_key(&target).unwrap(), target.addr(), 4096).unwrap();
        let foreign = ofi.alloc_region(4096).unwrap();
        let err = ep.put(&foreign, 0, 8, target.addr(), &key).unwrap_err();
        assert!(matches!(err, Error::MixedProviders { .. }), "{err}");
    }
}
