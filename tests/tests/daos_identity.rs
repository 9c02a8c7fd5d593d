//! Each tenant its own DAOS identity: an agent whose tenants name a `daos_user` makes
//! their DAOS calls from worker processes running as those users, and DAOS itself keeps
//! the tenants apart.
//!
//! Checked against the real DAOS system of the tier (`source RUNDIR/env`), as root (the
//! test makes the system users `dpuio-t-a`, `dpuio-t-b` and grants them the pool):
//! - the workers run as the tenants' users, with no capabilities, in sessions of their
//!   own, and the agent never holds the tenants' containers itself;
//! - the containers the workers created name only their owner (`daos container get-acl`
//!   as the tenant's user), and root, the agent's own identity, is refused by DAOS;
//! - a worker made (by the test-only hook `DPUIO_TEST_HOOK_WORKER_MOUNT`) to open the
//!   other tenant's container is refused by DAOS with `DER_NO_PERM`;
//! - SIGKILL of one tenant's worker under load: the other tenant's reads go on untouched
//!   (byte-exact, no error), and the tenant's own job continues on a new worker;
//! - SIGSTOP of a tenant's worker with a read of its out: the other tenant's job goes on;
//!   under a stat (which the data plane's engine waits for): the stat gives up on the
//!   stopped worker after a few seconds, a new one answers it, and the other tenant's job
//!   goes on then; stopped for good under a read: a new worker serves the read;
//! - a worker killed (by the test-only hook `DPUIO_TEST_HOOK_WORKER_DIE_AFTER`) after a
//!   put's create or replace, a rename or a remove and before it answered: the call, made
//!   again on a new worker, answers as the first run would have.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dpuio_shim::{ConnectOptions, DataPlaneOptions, TlsOptions};
use dpuio_tests::daos::{self, label};
use dpuio_tests::{AgentProcess, ok_stdout, seeded_bytes};

const FILE_BYTES: usize = 4 << 20;

/// The worker processes of this agent: pid by tenant.
fn workers(agent_pid: u32) -> Vec<(String, u32)> {
    let out = Command::new("pgrep").args(["-a", "-P", &agent_pid.to_string()]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("tenant-worker"))
        .filter_map(|l| {
            let pid = l.split_whitespace().next()?.parse().ok()?;
            let tenant = l.rsplit_once("--tenant ")?.1.trim().to_owned();
            Some((tenant, pid))
        })
        .collect()
}

/// `text` without the terminal colour escapes of the agent's log (`ESC [ ... m`).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for e in chars.by_ref() {
                if e == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn status_field(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find(|l| l.starts_with(field)).map(|l| l[field.len()..].trim().to_owned()).unwrap_or_default()
}

fn wait_until(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let since = Instant::now();
    while !done() {
        assert!(since.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// With the test hooks on, a worker SIGKILLs itself after it made a create, remove,
/// rename or replace of a path holding this, before it answers.
const DIE_AFTER: &str = "die-after";

/// An agent on `config` in `dir`, its log in `log`; with `hook`, its workers also try to
/// mount that container after each mount, and die after calls naming [`DIE_AFTER`] (the
/// test-only hooks).
fn start_agent(
    dir: &std::path::Path,
    config: &std::path::Path,
    log: &std::path::Path,
    hook: Option<&str>,
) -> AgentProcess {
    let mut program = Command::new(dpuio_tests::binary("dpu-agent"));
    if let Some(container) = hook {
        program.env("DPUIO_TEST_HOOK_WORKER_MOUNT", container);
        program.env("DPUIO_TEST_HOOK_WORKER_DIE_AFTER", DIE_AFTER);
    }
    program.stderr(Stdio::from(std::fs::File::create(log).unwrap()));
    AgentProcess::start_program(
        program,
        &dir.join("data"),
        &["--config", config.to_str().unwrap()],
        Duration::from_secs(60),
    )
}

/// A job for one tenant: read `file` again and again (checking every byte) and, with
/// `put`, write a checkpoint each round; counts rounds, keeps errors.
fn job(
    client: dpuio_shim::Client,
    want: Vec<u8>,
    put: bool,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut round = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match client.read_file("/data.bin") {
            Ok(got) if got == want => {}
            Ok(got) => errors.lock().unwrap().push(format!("round {round}: read {} bytes that differ", got.len())),
            Err(e) => errors.lock().unwrap().push(format!("round {round}: read: {e}")),
        }
        if put && let Err(e) = runtime.block_on(client.put_bytes("/ckpt.bin", &seeded_bytes(1 << 20, round))) {
            errors.lock().unwrap().push(format!("round {round}: put: {e}"));
        }
        round += 1;
        rounds.store(round, Ordering::Relaxed);
    }
}

#[test]
fn each_tenant_reaches_its_container_only_as_its_own_daos_user() {
    let test = "each_tenant_reaches_its_container_only_as_its_own_daos_user";
    let Some(d) = daos::system(test) else { return };
    let users = match (daos::tenant_identity(&d, "a"), daos::tenant_identity(&d, "b")) {
        (Ok(a), Ok(b)) => [a, b],
        (Err(e), _) | (_, Err(e)) => return daos::skip(test, &e),
    };
    let dir = tempfile::tempdir().unwrap();
    let containers = [label("ida"), label("idb")];
    let config = dir.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[backend]\nkind = \"daos\"\npool = \"{}\"\nagent_socket_dir = \"{}\"\ncreate_containers = true\n\n\
             [metrics]\nlisten = \"127.0.0.1:0\"\n\n\
             [[tenants]]\nname = \"a\"\ncontainer = \"{}\"\ndaos_user = \"{}\"\n\n\
             [[tenants]]\nname = \"b\"\ncontainer = \"{}\"\ndaos_user = \"{}\"\n",
            d.pool,
            d.socket_dir.display(),
            containers[0],
            users[0],
            containers[1],
            users[1]
        ),
    )
    .unwrap();
    let log = dir.path().join("agent.log");
    // After each mount, a worker also tries tenant a's container (made first: the agent
    // prepares its tenants' containers in name order).
    let agent = start_agent(dir.path(), &config, &log, Some(&containers[0]));
    let log_text = || plain(&std::fs::read_to_string(&log).unwrap_or_default());

    // The workers: one per tenant, as its user and group, no capabilities, no new
    // privileges, each the leader of a session of its own.
    let running = workers(agent.process.id());
    assert_eq!(running.len(), 2, "one worker per tenant, found {running:?}\n{}", log_text());
    for (tenant, pid) in &running {
        let user = &users[if tenant == "a" { 0 } else { 1 }];
        let out = Command::new("id").args(["-u", user]).output().unwrap();
        let uid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(status_field(*pid, "Uid:").split_whitespace().all(|u| u == uid), "worker of {tenant} not as {user}");
        assert_eq!(status_field(*pid, "CapEff:"), "0000000000000000", "worker of {tenant} holds capabilities");
        assert_eq!(status_field(*pid, "CapPrm:"), "0000000000000000", "worker of {tenant} holds capabilities");
        assert_eq!(status_field(*pid, "NoNewPrivs:"), "1");
        assert_eq!(status_field(*pid, "Groups:"), "", "worker of {tenant} keeps supplementary groups");
        let sid = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let sid: u32 = sid.rsplit_once(')').unwrap().1.split_whitespace().nth(3).unwrap().parse().unwrap();
        assert_eq!(sid, *pid, "worker of {tenant} is not in a session of its own");
    }

    // DAOS refuses tenant b's worker tenant a's container: DAOS's own check, not dpuio's.
    let hook = log_text();
    let refused = hook.lines().find(|l| l.contains("test hook") && l.contains("tenant=\"b\""));
    let refused = refused.unwrap_or_else(|| panic!("no test-hook line of tenant b's worker in:\n{hook}"));
    assert!(refused.contains("DER_NO_PERM") && refused.contains("refused"), "{refused}");
    assert!(
        hook.lines().any(|l| l.contains("test hook: mounted") && l.contains("tenant=\"a\"")),
        "tenant a's own worker should mount its container:\n{hook}"
    );

    // Data through each tenant's own certificate; tenant a over TCP, where its worker's
    // staging slots are registered with the transport and payload is put and got
    // straight from and into them (also across the restart of its worker below), b over
    // shared memory, where the agent lends the host's region it maps to b's worker, which
    // reads and writes it itself.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let certs = dir.path().join("certs");
    let connect = |tenant: &str, transports: &str| {
        let bundle = certs.join(tenant);
        ok_stdout(&agent.dpuctl(&["cert", "issue", "--tenant", tenant, "--out", bundle.to_str().unwrap()]));
        let options = ConnectOptions {
            agent: agent.url(),
            tls: TlsOptions::bundle(bundle),
            data_plane: Some(DataPlaneOptions { transports: transports.into(), rings: 1, ..Default::default() }),
            ..ConnectOptions::default()
        };
        runtime.block_on(dpuio_shim::Client::connect(options)).unwrap()
    };
    let (a, b) = (connect("a", "tcp"), connect("b", "shm"));
    let data = [seeded_bytes(FILE_BYTES, 71), seeded_bytes(FILE_BYTES, 72)];
    runtime.block_on(a.put_bytes("/data.bin", &data[0])).unwrap();
    runtime.block_on(b.put_bytes("/data.bin", &data[1])).unwrap();
    assert!(a.read_file("/data.bin").unwrap() == data[0]);
    assert!(b.read_file("/data.bin").unwrap() == data[1]);
    let metrics = dpuio_tests::scrape_metrics(agent.process.metrics_addr().expect("[metrics] listen is set"));
    let pieces = |tenant: &str, memory: &str| {
        let series = format!("dpuio_daos_worker_pieces_total{{tenant=\"{tenant}\",memory=\"{memory}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(&series)).and_then(|n| n.parse::<u64>().ok())
    };
    let (b_host, b_staging) = (pieces("b", "host").unwrap_or(0), pieces("b", "staging").unwrap_or(0));
    eprintln!("tenant b's worker pieces: {b_host} in host memory, {b_staging} through staging");
    assert!(b_host > 0 && b_staging == 0, "tenant b's pieces should run in the lent host region:\n{metrics}");
    assert_eq!(pieces("a", "host"), Some(0), "tenant a (TCP) has no mapped region:\n{metrics}");

    // DAOS's own tools: each container's ACL names only its owner, the tenant's user;
    // root (the agent's identity, and DAOS's admin on this machine) cannot open it.
    for (i, container) in containers.iter().enumerate() {
        let out = daos::daos_as(&users[i]).args(["container", "get-acl", &d.pool, container]).output().unwrap();
        let acl = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "get-acl as {}: {acl}{}", users[i], String::from_utf8_lossy(&out.stderr));
        let entries: Vec<&str> = acl.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()).collect();
        assert_eq!(entries, ["A::OWNER@:rwdtTaAo"], "the ACL of {container}:\n{acl}");
        assert!(acl.contains(&format!("# Owner: {}@", users[i])), "the owner of {container}:\n{acl}");
        let out = Command::new("daos").args(["container", "get-acl", &d.pool, container]).output().unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success() && text.contains("DER_NO_PERM"), "root read {container}'s ACL: {text}");
        let copy = dir.path().join(format!("copy{i}.bin"));
        let out = Command::new("daos")
            .args(["filesystem", "copy", "--src", &format!("daos://{}/{container}/data.bin", d.pool), "--dst"])
            .arg(&copy)
            .output()
            .unwrap();
        assert!(!out.status.success() && !copy.exists(), "root copied tenant data out of {container}");
    }

    // Kill tenant a's worker under load: b never notices, a's job goes on.
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let rounds = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let jobs: Vec<_> = [(a.clone(), data[0].clone(), true), (b.clone(), data[1].clone(), false)]
        .into_iter()
        .zip(&rounds)
        .map(|((client, want, put), rounds)| {
            let (stop, rounds, errors) = (stop.clone(), rounds.clone(), errors.clone());
            std::thread::spawn(move || job(client, want, put, stop, rounds, errors))
        })
        .collect();
    wait_until("three rounds of each job", Duration::from_secs(120), || {
        rounds.iter().all(|r| r.load(Ordering::Relaxed) >= 3)
    });
    let (_, victim) = running.iter().find(|(t, _)| t == "a").cloned().unwrap();
    let other = running.iter().find(|(t, _)| t == "b").map(|(_, p)| *p).unwrap();
    let before = [rounds[0].load(Ordering::Relaxed), rounds[1].load(Ordering::Relaxed)];
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-KILL", &victim.to_string()]).status().unwrap().success());
    wait_until("three more rounds of each job after the kill", Duration::from_secs(120), || {
        rounds.iter().zip(before).all(|(r, b)| r.load(Ordering::Relaxed) >= b + 3)
    });
    let recovered = killed.elapsed();

    stop.store(true, Ordering::Relaxed);
    for j in jobs {
        j.join().expect("a job panicked");
    }
    let errors = errors.lock().unwrap();
    eprintln!(
        "worker of tenant a SIGKILLed: both jobs three rounds further {recovered:.2?} later; rounds a {} b {}",
        rounds[0].load(Ordering::Relaxed),
        rounds[1].load(Ordering::Relaxed)
    );
    assert!(errors.is_empty(), "the jobs saw errors: {errors:#?}");
    let now = workers(agent.process.id());
    let new_a = now.iter().find(|(t, _)| t == "a").map(|(_, p)| *p);
    assert!(new_a.is_some_and(|p| p != victim), "tenant a's worker was not replaced: {now:?}");
    assert!(now.iter().any(|(t, p)| t == "b" && *p == other), "tenant b's worker changed: {now:?}");
    let metrics = dpuio_tests::scrape_metrics(agent.process.metrics_addr().expect("[metrics] listen is set"));
    for (tenant, restarts) in [("a", 1), ("b", 0)] {
        let line = format!("dpuio_daos_worker_restarts_total{{tenant=\"{tenant}\"}} {restarts}");
        assert!(metrics.lines().any(|l| l == line), "no {line:?} in:\n{metrics}");
    }
    assert!(a.read_file("/data.bin").unwrap() == data[0] && b.read_file("/data.bin").unwrap() == data[1]);

    // Stop tenant a's worker (SIGSTOP: it answers nothing, as a worker stuck in DAOS or
    // in a bug would) while a read of a's is with it: b's job goes on meanwhile (no
    // thread of the agent waits for a worker's payload pieces: the engine sends a put/get
    // host's pieces to the worker and reads its reports as they come), and a's read
    // completes, byte-exact, once its worker runs again (well within the 180 s deadline).
    let file = runtime.block_on(a.open("/data.bin", dpuio_shim::Access::ReadOnly)).unwrap();
    let region = runtime.block_on(a.register_region(1 << 20, dpuio_shim::RegionAccess::WriteByAgent)).unwrap();
    let errors = Arc::new(Mutex::new(Vec::new()));
    let (stopped_pid, rounds, b_job) = stop_a_under_b_job(agent.process.id(), &b, &data[1], &errors);
    let held = std::thread::scope(|scope| {
        let read = scope.spawn(|| file.read_at(&region, 1 << 20));
        std::thread::sleep(Duration::from_millis(500)); // a's read is with its stopped worker
        let before = rounds.load(Ordering::Relaxed);
        let since = Instant::now();
        let b_alone = std::panic::catch_unwind(|| {
            wait_until("three more rounds of b's job while a's worker is stopped", Duration::from_secs(20), || {
                rounds.load(Ordering::Relaxed) >= before + 3
            })
        });
        let b_went_on = since.elapsed();
        let a_waiting = !read.is_finished();
        assert!(Command::new("kill").args(["-CONT", &stopped_pid.to_string()]).status().unwrap().success());
        let resumed = Instant::now();
        let got = read.join().expect("a's read panicked");
        if let Err(e) = b_alone {
            std::panic::resume_unwind(e);
        }
        assert!(a_waiting, "a's read did not wait for its stopped worker: the test did not stop what it meant to");
        (b_went_on, resumed.elapsed(), got)
    });
    b_job();
    let (b_went_on, a_after, got) = held;
    assert_eq!(got.unwrap_or_else(|e| panic!("a's held read: {e}")), 1 << 20);
    let mut bytes = vec![0u8; 1 << 20];
    region.read_at(0, &mut bytes);
    assert!(bytes[..] == data[0][1 << 20..2 << 20], "a's held read returned other bytes");
    assert!(errors.lock().unwrap().is_empty(), "b's job saw errors: {:#?}", errors.lock().unwrap());
    eprintln!(
        "worker of tenant a SIGSTOPped with a read of a's out: b's job three rounds further in {b_went_on:.2?}; \
         a's read done {a_after:.2?} after SIGCONT"
    );

    // Stop tenant a's worker again, now under a namespace call: a put/get host's stat (a
    // metadata entry of its ring). The engine hands a worker tenant's entries to threads
    // of their own, so b's job goes on while a's stat waits (before, the engine made the
    // call itself and b waited with it). The worker beats no more, so the call gives up
    // on it after a few seconds: the worker is killed and the stat answered by a new one.
    let (stopped_pid, rounds, b_job) = stop_a_under_b_job(agent.process.id(), &b, &data[1], &errors);
    let stopped = Instant::now();
    let (b_went_on, stat) = std::thread::scope(|scope| {
        let stat = scope.spawn(|| (runtime.block_on(a.stat("/data.bin")), stopped.elapsed()));
        let before = rounds.load(Ordering::Relaxed);
        let b_went_on = std::panic::catch_unwind(|| {
            wait_until(
                "three more rounds of b's job with a's worker stopped under a stat",
                Duration::from_secs(30),
                || rounds.load(Ordering::Relaxed) >= before + 3,
            )
        })
        .map(|()| stopped.elapsed());
        if b_went_on.is_err() {
            let _ = Command::new("kill").args(["-CONT", &stopped_pid.to_string()]).status();
        }
        (b_went_on, stat.join().expect("a's stat panicked"))
    });
    b_job();
    let b_went_on = b_went_on.unwrap_or_else(|e| std::panic::resume_unwind(e));
    let (attr, stat_took) = stat;
    let attr = attr.unwrap_or_else(|e| panic!("a's stat with its worker stopped: {e}\n{}", log_text()));
    assert_eq!(attr.size, FILE_BYTES as u64, "a's stat answered by its new worker");
    assert!(errors.lock().unwrap().is_empty(), "b's job saw errors: {:#?}", errors.lock().unwrap());
    assert!(
        !std::path::Path::new(&format!("/proc/{stopped_pid}")).exists(),
        "a's stopped worker {stopped_pid} was not killed"
    );
    assert!(workers(agent.process.id()).iter().any(|(t, p)| t == "a" && *p != stopped_pid), "a has no new worker");
    assert!(
        b_went_on < stat_took,
        "b's job went on only once a's stat was answered ({b_went_on:.2?} after the stop, the stat {stat_took:.2?}): \
         the engine waited for a's stopped worker"
    );
    eprintln!(
        "worker of tenant a SIGSTOPped under a stat of a's: a's stat answered {stat_took:.2?} later by a new worker, \
         b's job three rounds further {b_went_on:.2?} after the stop"
    );

    // Stopped for good with a read of a's out (no SIGCONT this time): the engine sees the
    // worker beat no more, takes it as lost, and the read's pieces run on a new worker,
    // byte-exact, long before the deadline would have answered them. (A read first: the
    // handle is then open on this worker, and the stopped one is met by the engine's
    // pieces, not by the blocking call that would open it.)
    assert_eq!(file.read_at(&region, 0).unwrap(), 1 << 20);
    let stopped_pid = workers(agent.process.id()).into_iter().find(|(t, _)| t == "a").map(|(_, p)| p).unwrap();
    assert!(Command::new("kill").args(["-STOP", &stopped_pid.to_string()]).status().unwrap().success());
    let stopped = Instant::now();
    let got = std::thread::scope(|scope| {
        let read = scope.spawn(|| file.read_at(&region, 2 << 20));
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            wait_until("a's read with its worker stopped for good", Duration::from_secs(20), || read.is_finished())
        }));
        if done.is_err() {
            let _ = Command::new("kill").args(["-CONT", &stopped_pid.to_string()]).status();
        }
        let got = read.join().expect("a's read panicked");
        done.unwrap_or_else(|e| std::panic::resume_unwind(e));
        got
    });
    let read_took = stopped.elapsed();
    assert_eq!(got.unwrap_or_else(|e| panic!("a's read with its worker stopped: {e}")), 1 << 20);
    region.read_at(0, &mut bytes);
    assert!(bytes[..] == data[0][2 << 20..3 << 20], "a's read on the new worker returned other bytes");
    assert!(!std::path::Path::new(&format!("/proc/{stopped_pid}")).exists(), "a's stopped worker was not killed");
    eprintln!("worker of tenant a SIGSTOPped for good with a read of a's out: the read done {read_took:.2?} later");

    // Calls that cannot simply run twice, their worker killed after making them and
    // before answering (the test-only hook): made again on a new worker, each answers as
    // the first run would have. A put (an exclusive create of its temporary file, then a
    // replace), a rename, a remove; an exclusive create of any other name says "already
    // exists", since whether this call made the file cannot be told.
    let put = &data[0][..1 << 20];
    runtime.block_on(a.put_bytes("/die-after-put.bin", put)).unwrap_or_else(|e| panic!("put: {e}\n{}", log_text()));
    assert!(a.read_file("/die-after-put.bin").unwrap() == put, "the put's bytes differ");
    runtime.block_on(a.rename("/die-after-put.bin", "/die-after-moved.bin")).unwrap();
    runtime.block_on(a.remove("/die-after-moved.bin", false)).unwrap();
    let listed = runtime.block_on(a.readdir("/")).unwrap();
    let left: Vec<_> = listed.iter().filter(|e| e.name.contains(DIE_AFTER)).map(|e| &e.name).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    let Err(e) = runtime.block_on(a.create("/die-after-exclusive", true)) else {
        panic!("an exclusive create made again on a new worker succeeded")
    };
    assert!(e.to_string().contains("ALREADY_EXISTS"), "{e}");
    let settled = log_text().lines().filter(|l| l.contains("had run before; taken as done")).count();
    assert_eq!(settled, 3, "the replace, rename and remove settled by their second run:\n{}", log_text());
    let metrics = dpuio_tests::scrape_metrics(agent.process.metrics_addr().expect("[metrics] listen is set"));
    let line = "dpuio_daos_worker_restarts_total{tenant=\"a\"} 8";
    assert!(metrics.lines().any(|l| l == line), "no {line:?} in:\n{metrics}");

    // A tenant added at run time with its own DAOS identity: its worker, its ACL.
    let user_c = daos::tenant_identity(&d, "c").unwrap_or_else(|e| panic!("{e}"));
    let container_c = label("idc");
    ok_stdout(&agent.dpuctl(&["tenant", "add", "c", "--container", &container_c, "--daos-user", &user_c]));
    let listed = ok_stdout(&agent.dpuctl(&["tenant", "list"]));
    assert!(listed.contains(&format!("DAOS identity: user {user_c}")), "{listed}");
    let c = connect("c", "shm");
    runtime.block_on(c.put_bytes("/data.bin", &data[0])).unwrap();
    assert!(c.read_file("/data.bin").unwrap() == data[0]);
    let worker_c = workers(agent.process.id()).iter().find(|(t, _)| t == "c").map(|(_, p)| *p);
    let worker_c = worker_c.unwrap_or_else(|| panic!("no worker for tenant c"));
    assert!(workers(agent.process.id()).iter().any(|(t, p)| t == "c" && *p == worker_c));
    let out = daos::daos_as(&user_c).args(["container", "get-acl", &d.pool, &container_c]).output().unwrap();
    let acl = String::from_utf8_lossy(&out.stdout);
    assert!(acl.contains(&format!("# Owner: {user_c}@")) && !acl.contains("GROUP@"), "{acl}");
    let refused = agent.dpuctl(&["tenant", "add", "e", "--daos-user", "dpuio-no-such-user"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("useradd --system dpuio-no-such-user"), "{said}");
    drop(c);
    drop((a, b));
    drop(agent);

    // An ACL that admits someone else is named, by check-config and by serve.
    let check = || {
        let out = Command::new(dpuio_tests::binary("dpu-agent")).arg("check-config").arg(&config).output().unwrap();
        assert!(out.status.success(), "check-config: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let said = check();
    for (tenant, container) in ["a", "b"].iter().zip(&containers) {
        let line = format!("tenant {tenant:?}: container {container:?} admits its DAOS user");
        assert!(said.contains(&line), "check-config does not say {line:?}:\n{said}");
    }
    let out = daos::daos_as(&users[0])
        .args(["container", "update-acl", &d.pool, &containers[0], "--entry", "A::root@:r"])
        .output()
        .unwrap();
    assert!(out.status.success(), "update-acl: {}", String::from_utf8_lossy(&out.stderr));
    let said = check();
    assert!(
        said.lines()
            .any(|l| l.contains("tenant \"a\"") && l.contains("admits other principals") && l.contains("A::root@:r")),
        "check-config does not name tenant a's extra principal:\n{said}"
    );
    let log = dir.path().join("agent2.log");
    let again = start_agent(dir.path(), &config, &log, None);
    let said = plain(&std::fs::read_to_string(&log).unwrap_or_default());
    assert!(
        said.lines().any(|l| l.contains("WARN") && l.contains("tenant=\"a\"") && l.contains("A::root@:r")),
        "serve does not name tenant a's extra principal:\n{said}"
    );
    drop(again);
    destroy_as(
        &d.pool,
        &[containers[0].clone(), containers[1].clone(), container_c],
        &[users[0].clone(), users[1].clone(), user_c],
    );
}

/// Start tenant b's job (reading `want` again and again) and, three rounds in, SIGSTOP
/// tenant a's worker: its pid, b's round count, and what stops b's job and joins it.
fn stop_a_under_b_job(
    agent_pid: u32,
    b: &dpuio_shim::Client,
    want: &[u8],
    errors: &Arc<Mutex<Vec<String>>>,
) -> (u32, Arc<AtomicU64>, impl FnOnce()) {
    let stopped_pid = workers(agent_pid).into_iter().find(|(t, _)| t == "a").map(|(_, p)| p).unwrap();
    let (stop, rounds) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let thread = {
        let (client, want, stop, rounds, errors) =
            (b.clone(), want.to_vec(), stop.clone(), rounds.clone(), errors.clone());
        std::thread::spawn(move || job(client, want, false, stop, rounds, errors))
    };
    wait_until("three rounds of b's job", Duration::from_secs(60), || rounds.load(Ordering::Relaxed) >= 3);
    assert!(Command::new("kill").args(["-STOP", &stopped_pid.to_string()]).status().unwrap().success());
    let end = move || {
        stop.store(true, Ordering::Relaxed);
        thread.join().expect("b's job panicked");
    };
    (stopped_pid, rounds, end)
}

/// The containers belong to the tenants' users: root cannot destroy them, so each is
/// destroyed as its owner.
fn destroy_as(pool: &str, containers: &[String], users: &[String]) {
    for (container, user) in containers.iter().zip(users) {
        let _ = daos::daos_as(user).args(["container", "destroy", "--force", pool, container]).output();
    }
}
