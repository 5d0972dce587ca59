//! Cost of canonicalizing and hashing params versus hashing the same bytes raw,
//! at the sizes params typically come in (about 64 B, 1 KiB and 16 KiB).
//! `cargo bench -p keyturn-core --bench canonical`

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use keyturn_core::canonical::{canonicalize_str, params_hash, params_hash_str};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Email-like params padded with `n` recipients and a body, to reach a size.
fn params_of_size(target: usize) -> Value {
    let mut v = json!({"to": "ann@example.com", "subject": "Q3", "n": 4.5});
    let mut i = 0;
    while serde_json::to_string(&v).map_or(0, |s| s.len()) < target {
        v[format!("k{i:04}")] = json!({"id": i, "name": "déjà vu 😂", "ok": true, "w": 0.25});
        i += 1;
    }
    v
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("params");
    for (label, size) in [("64B", 64), ("1KiB", 1024), ("16KiB", 16 * 1024)] {
        let params = if size == 64 {
            json!({"to": "ann@example.com", "subject": "Q3 numbers", "n": 1})
        } else {
            params_of_size(size)
        };
        let text = serde_json::to_string(&params).expect("serializable");
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_with_input(BenchmarkId::new("sha256_raw", label), &text, |b, t| {
            b.iter(|| Sha256::digest(black_box(t.as_bytes())))
        });
        group.bench_with_input(
            BenchmarkId::new("canonicalize_str", label),
            &text,
            |b, t| b.iter(|| canonicalize_str(black_box(t))),
        );
        group.bench_with_input(BenchmarkId::new("params_hash_str", label), &text, |b, t| {
            b.iter(|| params_hash_str("send_email", black_box(t)))
        });
        group.bench_with_input(
            BenchmarkId::new("params_hash_value", label),
            &params,
            |b, p| b.iter(|| params_hash("send_email", black_box(p))),
        );
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
