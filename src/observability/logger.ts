// Structured logging (pino). One root logger per process, built in cmd/; modules take a child.
import { pino, type Logger } from 'pino';

export type { Logger };

export interface LoggerOptions {
  readonly name: string;
  readonly level?: string;
}

export function createLogger({ name, level }: LoggerOptions): Logger {
  return pino({ name, level: level ?? process.env.LOG_LEVEL ?? 'info', base: { service: name } });
}

/** A logger that drops everything: for tests and benchmarks that assert on state, not logs. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
