// Per-call gRPC metrics of the API server: requests by method and code, and latency by method.
// Kept next to the server (not in FleetMetrics) because they describe the transport, not the fleet.
import { Counter, Histogram, type Registry } from 'prom-client';

export class ApiMetrics {
  readonly requests: Counter<'method' | 'code'>;
  readonly duration: Histogram<'method'>;

  constructor(registry: Registry) {
    const registers = [registry];
    this.requests = new Counter({ name: 'sandboxfleet_grpc_requests_total', help: 'gRPC calls handled, by method and status code', labelNames: ['method', 'code'], registers });
    this.duration = new Histogram({
      name: 'sandboxfleet_grpc_request_duration_seconds',
      help: 'gRPC call handling time, by method',
      labelNames: ['method'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
      registers,
    });
  }
}
