//! A ring's header and the indices in it (`RingHeader::decode`, `RingWindow::check`),
//! as the agent reads them from host memory: whatever the host wrote, the slots the
//! agent then reads and writes lie inside the ring's bytes, and it never takes more
//! than was submitted or posts more than there is room for.
#![no_main]

use dpuio_fuzz::Input;
use dpuio_proto::wire::{self, CQE_BYTES, HEADER_BYTES, RingHeader, RingWindow, SQE_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|b: &[u8]| {
    let Ok(header) = RingHeader::decode(b) else { return };
    assert_eq!(&header.encode()[..], &b[..HEADER_BYTES], "a ring header re-encodes to its bytes");
    let mut input = Input(&b[HEADER_BYTES..]);
    let (sq_head, cq_tail, sq_tail, cq_head) = (input.u64(), input.u64(), input.u64(), input.u64());
    let entries = header.entries;
    let Some(window) = RingWindow::check(entries, sq_head, cq_tail, sq_tail, cq_head) else {
        return;
    };
    assert!(window.submitted <= u64::from(entries) && window.completion_room <= u64::from(entries));
    assert_eq!(sq_head.wrapping_add(window.submitted), sq_tail);
    let ring = wire::ring_bytes(entries);
    let take = window.submitted.min(window.completion_room);
    // Every slot of the batch, and the ring's first and last slots, lie in the ring.
    for i in (0..take.min(64)).chain([take.saturating_sub(1)]) {
        let sqe = wire::sqe_offset(entries, sq_head.wrapping_add(i));
        let cqe = wire::cqe_offset(entries, cq_tail.wrapping_add(i));
        assert!(sqe >= wire::SQ_OFFSET && sqe + SQE_BYTES <= wire::SQ_OFFSET + entries as usize * SQE_BYTES);
        assert!(cqe >= wire::SQ_OFFSET + entries as usize * SQE_BYTES && cqe + CQE_BYTES <= ring);
    }
});
