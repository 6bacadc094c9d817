#!/usr/bin/env node
// A TCP tunnel across a network namespace boundary without a route: the test cluster's network
// namespace has no link to the host's (scripts/test-cluster), so the API server, port-forwards and
// Prometheus inside it are reached through a unix socket, which lives in the file system that both
// namespaces share.
//   node netns-tunnel.mjs in  SOCKET HOST:PORT          (run inside the namespace) each connection
//                                                       to SOCKET is piped to HOST:PORT there
//   node netns-tunnel.mjs out 127.0.0.1:PORT SOCKET [PORTFILE]   (run on the host) each connection to
//                                                       the loopback port is piped to SOCKET; PORT 0
//                                                       picks one, written to PORTFILE when given
// Plain Node, no dependencies: it runs before and outside the project's TypeScript.
import process from 'node:process';
import { createConnection, createServer } from 'node:net';
import { rmSync, writeFileSync } from 'node:fs';

const [mode, a, b, portFile] = process.argv.slice(2);
function pipe(client, connect) {
  const upstream = connect();
  client.pipe(upstream).pipe(client);
  const close = () => { client.destroy(); upstream.destroy(); };
  client.on('error', close);
  upstream.on('error', close);
  client.on('close', close);
  upstream.on('close', close);
}
function hostPort(s) {
  const i = s.lastIndexOf(':');
  return { host: s.slice(0, i), port: Number(s.slice(i + 1)) };
}
if (mode === 'in') {
  rmSync(a, { force: true });
  const target = hostPort(b);
  createServer((c) => pipe(c, () => createConnection(target))).listen(a);
} else if (mode === 'out') {
  const { host, port } = hostPort(a);
  if (host !== '127.0.0.1') throw new Error('the host side listens on 127.0.0.1 only');
  const server = createServer((c) => pipe(c, () => createConnection(b)));
  server.listen(port, host, () => {
    if (portFile) writeFileSync(portFile, `${server.address().port}\n`);
  });
} else {
  process.stderr.write('usage: netns-tunnel.mjs in SOCKET HOST:PORT | out 127.0.0.1:PORT SOCKET [PORTFILE]\n');
  process.exit(2);
}
