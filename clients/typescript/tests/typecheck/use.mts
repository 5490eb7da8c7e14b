// Compiles (tsc --noEmit, Node16 resolution) against the installed
// package: its types as an ESM and a CommonJS user see them. Run by
// scripts/packaged.sh --test.
import { Client, DeadlineExceededError, type ClientOptions } from '@idgen/client';
const options: ClientOptions = { endpoints: ['127.0.0.1:50051'], deadlineMs: 1000 };
const client = await Client.connect(options);
const id: bigint = await client.nextId('snowflake');
const ids: bigint[] = await client.genIds('strict', 'orders/k1', 2);
const s: string = await client.nextIdString('segment', 'orders');
try { await client.genId('lease'); } catch (e) { if (e instanceof DeadlineExceededError) { const n: number = e.attempts; void n; } }
void [id, ids, s];
