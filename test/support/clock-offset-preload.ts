// Preload (`node --import tsx --import <this file>`) for a child process whose wall clock a test steps
// at run time, as NTP stepping a node's clock would (the chaos runner's clock_jump on a host agent,
// whose binary reads the system clock). Date.now() reads the real clock plus the offset in
// milliseconds written to the file named by SF_CLOCK_OFFSET_FILE, re-read every 100 ms. Only the
// wall clock moves: monotonic clocks (performance.now, timers) do not, as on a real host.
import { readFileSync } from 'node:fs';

const file = process.env.SF_CLOCK_OFFSET_FILE;
if (file !== undefined && file !== '') {
  const realNow = Date.now.bind(Date);
  let offsetMs = 0;
  const read = (): void => {
    try {
      const n = Number(readFileSync(file, 'utf8').trim());
      if (Number.isFinite(n)) offsetMs = n;
    } catch {
      // Not written yet: the clock is not stepped.
    }
  };
  read();
  setInterval(read, 100).unref();
  Date.now = () => realNow() + offsetMs;
}
