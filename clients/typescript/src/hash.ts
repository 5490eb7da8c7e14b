/**
 * The strict key's node: FNV-1a 64 of the key and a rendezvous (highest
 * random weight) score per node address, bit for bit as the Rust crate
 * computes them (client/src/nodes.rs), in BigInt arithmetic, so that
 * every client in every language sends one key to one node.
 */

const MASK = (1n << 64n) - 1n;
const FNV_OFFSET = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;

/** FNV-1a 64 of the UTF-8 bytes of `s` (no per-process seed). */
export function keyHash(s: string): bigint {
  let h = FNV_OFFSET;
  for (const b of Buffer.from(s, 'utf8')) {
    h = ((h ^ BigInt(b)) * FNV_PRIME) & MASK;
  }
  return h;
}

/** `x` rotated left by `n` bits, as u64::rotate_left. */
function rotl(x: bigint, n: bigint): bigint {
  return ((x << n) | (x >> (64n - n))) & MASK;
}

/**
 * The score of node `addr` for key hash `key`: splitmix64's finaliser
 * over the pair; the node with the highest score serves the key, and
 * when it leaves only its keys move, each to its own next node.
 */
export function rendezvous(key: bigint, addr: string): bigint {
  let z = key ^ rotl(keyHash(addr), 29n);
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK;
  return z ^ (z >> 31n);
}
