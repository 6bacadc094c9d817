// R-H5 / R-I6: which Kubernetes Node states mean "this host is going away", and why.
import { describe, expect, it } from 'vitest';
import fc from 'fast-check';
import { nodeDepartureSource, type NodeTaint } from '../../../src/core/node-signals.ts';
import { PROPERTY_RUNS } from '../../support/property-runs.ts';

const node = (over: { unschedulable?: boolean; taints?: NodeTaint[] } = {}) => ({ name: 'host-a', unschedulable: over.unschedulable ?? false, taints: over.taints ?? [] });
const harmless = fc.record({
  key: fc.constantFrom('node-role.kubernetes.io/control-plane', 'dedicated', 'node.kubernetes.io/not-ready', 'karpenter.sh/disruption', 'example.com/gpu'),
  value: fc.option(fc.constantFrom('true', 'gpu', 'candidate'), { nil: undefined }),
  effect: fc.constantFrom('NoSchedule', 'PreferNoSchedule', 'NoExecute'),
});

describe('nodeDepartureSource', () => {
  it('reads deletion, preemption notices, autoscaler taints and cordons, most specific first', () => {
    expect(nodeDepartureSource(undefined)).toBe('node_deleted');
    expect(nodeDepartureSource(node())).toBeUndefined();
    expect(nodeDepartureSource(node({ unschedulable: true }))).toBe('node_cordoned');
    expect(nodeDepartureSource(node({ taints: [{ key: 'ToBeDeletedByClusterAutoscaler', value: '1764500000', effect: 'NoSchedule' }] }))).toBe('disruption_taint');
    expect(nodeDepartureSource(node({ taints: [{ key: 'karpenter.sh/disrupted', effect: 'NoSchedule' }] }))).toBe('disruption_taint');
    expect(nodeDepartureSource(node({ taints: [{ key: 'karpenter.sh/disruption', value: 'disrupting', effect: 'NoSchedule' }] }))).toBe('disruption_taint');
    expect(nodeDepartureSource(node({ unschedulable: true, taints: [{ key: 'aws-node-termination-handler/spot-itn', effect: 'NoExecute' }, { key: 'ToBeDeletedByClusterAutoscaler' }] }))).toBe('spot_preemption');
    expect(nodeDepartureSource(node({ taints: [{ key: 'cloud.google.com/impending-node-termination', effect: 'NoSchedule' }] }))).toBe('spot_preemption');
  });

  it('never reads ordinary taints (or a Karpenter candidate) as a departure of a schedulable node', () => {
    fc.assert(fc.property(fc.array(harmless, { maxLength: 6 }), (taints) => {
      return nodeDepartureSource(node({ taints })) === undefined;
    }), { numRuns: PROPERTY_RUNS });
  });

  it('a cordon is a departure whatever ordinary taints come with it', () => {
    fc.assert(fc.property(fc.array(harmless, { maxLength: 6 }), (taints) => {
      return nodeDepartureSource(node({ unschedulable: true, taints })) === 'node_cordoned';
    }), { numRuns: PROPERTY_RUNS });
  });
});
