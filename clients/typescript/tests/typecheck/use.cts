// The CommonJS side of use.mts.
import idgen = require('@idgen/client');
async function main(): Promise<bigint> {
  const client = await idgen.Client.connect({ consul: true });
  return client.nextId('snowflake');
}
void main;
