// Builds the package from the repository's proto/ (the one copy of the
// service definition): copies idgen.proto into proto/ (shipped in the
// package, loaded at run time), generates TypeScript types from it with
// proto-loader-gen-types (no protoc), then compiles src/ to CommonJS with
// .d.ts files in dist/cjs and writes the ESM entry dist/esm/index.js.
import { execFileSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const repoProto = join(root, '..', '..', 'proto', 'idgen', 'v1', 'idgen.proto');
const shipped = join(root, 'proto', 'idgen', 'v1', 'idgen.proto');
const bin = (name) => join(root, 'node_modules', '.bin', name);
const run = (cmd, args) => execFileSync(cmd, args, { cwd: root, stdio: 'inherit' });

// The package's version follows the proto's (proto/Cargo.toml).
const protoCargo = join(root, '..', '..', 'proto', 'Cargo.toml');
if (existsSync(protoCargo)) {
  const want = /^version = "([^"]+)"/m.exec(readFileSync(protoCargo, 'utf8'))?.[1];
  const have = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')).version;
  if (want !== have) throw new Error(`package.json version ${have} differs from proto/Cargo.toml's ${want}: set it to ${want}`);
}
if (existsSync(repoProto)) {
  mkdirSync(dirname(shipped), { recursive: true });
  cpSync(repoProto, shipped);
} else if (!existsSync(shipped)) {
  throw new Error(`no idgen.proto: expected ${repoProto} (build inside the idgen repository)`);
}
rmSync(join(root, 'src', 'gen'), { recursive: true, force: true });
run(bin('proto-loader-gen-types'), [
  '--keepCase', '--longs=String', '--enums=String', '--defaults', '--oneofs',
  'idgen/v1/idgen.proto', '--grpcLib=@grpc/grpc-js', '--outDir=src/gen', '--includeDirs=proto',
]);
rmSync(join(root, 'dist'), { recursive: true, force: true });
run(bin('tsc'), ['-p', 'tsconfig.json']);
writeFileSync(join(root, 'dist', 'cjs', 'package.json'), '{"type":"commonjs"}\n');
// The ESM entry re-exports the CommonJS build by name: one copy of the
// client's state whichever way it is loaded (no dual-package hazard).
mkdirSync(join(root, 'dist', 'esm'), { recursive: true });
const names = Object.keys(createRequire(import.meta.url)(join(root, 'dist', 'cjs', 'index.js')))
  .filter((n) => n !== '__esModule');
writeFileSync(
  join(root, 'dist', 'esm', 'index.js'),
  `import cjs from '../cjs/index.js';\n${names.map((n) => `export const ${n} = cjs.${n};`).join('\n')}\n`,
);
writeFileSync(join(root, 'dist', 'esm', 'index.d.ts'), "export * from '../cjs/index.js';\n");
writeFileSync(join(root, 'dist', 'esm', 'package.json'), '{"type":"module"}\n');
// The conformance driver's bin entry (see clients/conformance/).
writeFileSync(
  join(root, 'dist', 'conformance.js'),
  "#!/usr/bin/env node\n'use strict';\nrequire('./cjs/conformance.js').main();\n",
  { mode: 0o755 },
);
