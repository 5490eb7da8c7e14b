// The ESM entry: named imports work and are the very classes the
// CommonJS entry exports (one copy of the client's state).
import test from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { Client, IdgenError, keyHash } from '@idgen/client';

test('the ESM entry exports the CommonJS classes by name', () => {
  const cjs = createRequire(import.meta.url)('@idgen/client');
  assert.equal(Client, cjs.Client);
  assert.equal(IdgenError, cjs.IdgenError);
  assert.equal(keyHash('a'), 0xaf63dc4c8601ec8cn);
});

test('a client without nodes is a configuration error with code CONFIG', async () => {
  await assert.rejects(Client.connect({}), (e) => e instanceof IdgenError && e.code === 'CONFIG');
});
