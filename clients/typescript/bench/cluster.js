'use strict';
// Starts the Consul emulator and three idgen nodes (tests/fixture.js),
// prints their gRPC addresses comma-separated and, on a second line,
// their process ids, and keeps them up until stdin closes. Used by scripts/bench-ts-client.sh.
const { Cluster } = require('../tests/fixture');

(async () => {
  const cluster = await new Cluster().start(3);
  console.log(cluster.nodes.map((n) => n.grpc).join(','));
  console.log(cluster.nodes.map((n) => n.proc.pid).join(','));
  process.stdin.resume();
  process.stdin.on('end', async () => {
    await cluster.stop();
    process.exit(0);
  });
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
