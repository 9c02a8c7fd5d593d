//! A session's rings grow when every one is busy: a call that finds no free ring for a
//! moment registers one more (up to four times the first count, and at least 32: a
//! loader's threads each need one), so a request the agent
//! holds (a read DAOS keeps while its engines are gone) does not hold up the session's
//! other calls; at the bound, or when the agent refuses a further ring (the tenant's
//! `max_regions_per_session`), calls wait for a ring given back. Rings a burst made are
//! given back to the agent once idle.

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use dpuio_shim::{Batch, Client, ConnectOptions, DataPlaneOptions};
use dpuio_tests::{AgentProcess, ok_stdout};

/// An agent with a file `/data/a` and a client that starts with one ring, and the
/// directory both live in.
async fn agent_and_one_ring_client() -> (tempfile::TempDir, AgentProcess, Arc<Client>) {
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &[]);
    agent.seed_file("/data/a", b"the answer");
    let options = ConnectOptions {
        data_plane: Some(DataPlaneOptions { transports: "ucx-shm".into(), rings: 1, ..Default::default() }),
        ..agent.connect_options()
    };
    let client = Arc::new(Client::connect(options).await.unwrap());
    (dir, agent, client)
}

/// Read `path` on a thread of its own (a blocking ring call); its answer comes on the
/// channel.
fn read_on_a_thread(client: &Arc<Client>, path: &str) -> mpsc::Receiver<dpuio_shim::Result<Vec<u8>>> {
    let (client, path, (tx, rx)) = (client.clone(), path.to_owned(), mpsc::channel());
    std::thread::spawn(move || tx.send(client.read_file(&path)));
    rx
}

/// Take `n` batches, each holding a ring, on a thread of its own (taking a ring blocks).
fn hold_rings(client: &Arc<Client>, n: usize) -> Vec<Batch> {
    let client = client.clone();
    std::thread::spawn(move || (0..n).map(|_| client.batch().unwrap()).collect()).join().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_finding_every_ring_held_gets_a_further_ring_up_to_the_bound() {
    // The agent lives while its handle does.
    let (_dir, _agent, client) = agent_and_one_ring_client().await;

    // The one ring held (as by a read the agent's storage keeps): a read still gets an
    // answer, on a ring registered for it.
    let mut held = hold_rings(&client, 1);
    let got = read_on_a_thread(&client, "/data/a").recv_timeout(Duration::from_secs(30));
    assert_eq!(got.expect("a read while the only ring is held").unwrap(), b"the answer");

    // 32 rings in all are held (the bound for one at first: four times one is less):
    // the next call waits for one given back, and then goes on.
    held.extend(hold_rings(&client, 31));
    let waiting = read_on_a_thread(&client, "/data/a");
    assert!(
        waiting.recv_timeout(Duration::from_millis(1500)).is_err(),
        "a 33rd ring was taken or registered while 32 were held"
    );
    drop(held.pop());
    let got = waiting.recv_timeout(Duration::from_secs(30)).expect("the read once a ring was given back");
    assert_eq!(got.unwrap(), b"the answer");
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_agent_refuses_a_further_ring_calls_wait_for_one_given_back() {
    let (_dir, agent, client) = agent_and_one_ring_client().await;
    let held = hold_rings(&client, 1);
    // The session is held to the new limit at its next registration: no further ring.
    ok_stdout(&agent.dpuctl(&["tenant", "set-limits", "default", "--max-regions-per-session", "1"]));
    let waiting = read_on_a_thread(&client, "/data/a");
    assert!(
        waiting.recv_timeout(Duration::from_millis(1500)).is_err(),
        "the read went on though the agent refused a further ring and the only one was held"
    );
    drop(held);
    let got = waiting.recv_timeout(Duration::from_secs(30)).expect("the read once the ring was given back");
    assert_eq!(got.unwrap(), b"the answer");
}

/// The regions the agent holds for the one session attached (a ring is one, its memory).
fn session_regions(agent: &AgentProcess) -> usize {
    let out = ok_stdout(&agent.dpuctl(&["sessions"]));
    let row = out.lines().nth(1).unwrap_or_else(|| panic!("no session listed:\n{out}"));
    row.split_whitespace().nth(3).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no regions in {row:?}"))
}

/// Rings a burst made are given back to the agent once they have been free for a while
/// (`RING_IDLE`, 10 s), down to the first count: one each time a call gives its ring back,
/// and, with no call at all, every one of them at the client supervisor's next probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rings_a_burst_made_are_given_back_once_idle() {
    let (_dir, agent, client) = agent_and_one_ring_client().await;
    let before = session_regions(&agent);
    drop(hold_rings(&client, 3)); // two more rings made, all three free again
    let grown = session_regions(&agent);
    assert_eq!(grown, before + 2, "two rings made for the burst");
    // Freed just now: a call takes one and gives it back, nothing is retired.
    let read = |client: &Arc<Client>| read_on_a_thread(client, "/data/a").recv_timeout(Duration::from_secs(30));
    assert_eq!(read(&client).expect("a read").unwrap(), b"the answer");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(session_regions(&agent), grown, "no ring given back before it was idle");
    // No call from now on: the supervisor's probes (every 10 s, a third of the lease)
    // give back the rings free for 10 s.
    let idle = std::time::Instant::now();
    let mut regions = session_regions(&agent);
    while regions != before && idle.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
        regions = session_regions(&agent);
    }
    assert_eq!(regions, before, "the burst's two idle rings were given back without a call, the first one kept");
    eprintln!("an idle session's grown rings given back {:.1?} after its last call", idle.elapsed());
    // The session goes on, and grows again when it needs to.
    let held = hold_rings(&client, 2);
    assert_eq!(session_regions(&agent), before + 1);
    drop(held);
    assert_eq!(read(&client).expect("a read after the shrink").unwrap(), b"the answer");
}
