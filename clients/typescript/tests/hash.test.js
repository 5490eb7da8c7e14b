'use strict';
// The strict key's node must be the same from every client: FNV-1a 64 and
// the rendezvous score bit for bit as client/src/nodes.rs computes them.
const test = require('node:test');
const assert = require('node:assert/strict');
const { keyHash, rendezvous } = require('@idgen/client');

test('the key hash is FNV-1a 64 (published vectors, as in client/src/nodes.rs)', () => {
  assert.equal(keyHash(''), 0xcbf29ce484222325n);
  assert.equal(keyHash('a'), 0xaf63dc4c8601ec8cn);
  assert.equal(keyHash('foobar'), 0x85944171f73967e8n);
});

// Printed by client/src/nodes.rs's key_hash and rendezvous, copied
// verbatim into a one-file Rust program: key, hash, then the score of
// each address in ADDRS.
const ADDRS = ['10.0.0.1:50051', '10.0.0.2:50051', '10.0.0.3:50051', '127.0.0.1:40001', '[::1]:50051'];
const VECTORS = [
  ['', '14695981039346656037', '18007879231935598776 5531843596442098213 5703661893148592082 2388301992675214721 2940304399424397425'],
  ['a', '12638187200555641996', '1784698178269305895 17727167439515218542 10712180409393367379 3904127226314096300 18337422396754749223'],
  ['foobar', '9625390261332436968', '12966607816591004300 17591827982453318319 9925934246220598805 13353986739240822480 10454970807570646193'],
  ['orders/k7', '12037581902147786451', '4973057188323236896 16122347057140277019 2504604398700489886 17459373696896046070 12800713543619904144'],
  ['flights/lh400', '8545352306076314791', '14866353785294872268 13782926110166543608 17011224121300053688 18222088565979052093 6110627308660734007'],
  ['ns/ключ', '3040693458922810119', '11985448604318656816 8528381472310668811 15624750365329793404 1282836383072871405 9819273365812666300'],
];

test('rendezvous scores match the Rust crate bit for bit (UTF-8 keys, IPv6 addresses)', () => {
  for (const [key, hash, scores] of VECTORS) {
    const h = keyHash(key);
    assert.equal(h.toString(), hash, `hash of ${JSON.stringify(key)}`);
    const want = scores.split(' ');
    ADDRS.forEach((addr, i) => assert.equal(rendezvous(h, addr).toString(), want[i], `${key} @ ${addr}`));
  }
});
