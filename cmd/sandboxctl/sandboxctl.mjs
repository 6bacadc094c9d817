#!/usr/bin/env node
// Launcher of `sandboxctl` (R-I7) for PATH, npm's `bin` and kubectl's plugin lookup: the CLI is
// TypeScript run by tsx, so this plain-JS entry registers tsx's loader and runs main.ts. Resolving
// `tsx` from here (not from the caller's directory) works in a checkout and when the package is
// installed with its dependencies hoisted. Installed as `kubectl-sandbox` (a symlink to this file
// on PATH), `kubectl sandbox hosts` runs `sandboxctl hosts`.
import { register } from 'tsx/esm/api';

register();
await import('./main.ts');
