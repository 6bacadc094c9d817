// The one writer of checkpoint index records (sf_checkpoints): one record per checkpoint whose
// manifest an agent wrote (R-G3), created once (write-once: a repeat finds it there) and deleted only
// by retention (R-G7) after its chunks and manifest are gone. Reads for decisions that act on a
// checkpoint come from the store; loops find candidates in the read model (fleet-state.ts).
import { CasConflictError } from '../store/errors.ts';
import type { KvRepository, Versioned } from '../store/kv-repository.ts';
import { Keys } from './keys.ts';
import type { CheckpointRecord } from './records.ts';

export class CheckpointIndex {
  constructor(private readonly repo: KvRepository<CheckpointRecord>) {}

  get bucket(): string {
    return this.repo.bucket;
  }

  async get(groupId: string, checkpointId: string): Promise<CheckpointRecord | undefined> {
    return (await this.repo.get(Keys.checkpoint(groupId, checkpointId)))?.value;
  }

  async getVersioned(key: string): Promise<Versioned<CheckpointRecord> | undefined> {
    return this.repo.get(key);
  }

  /** Index `record`; one already there (a repeated step) is kept as it is. */
  async create(record: CheckpointRecord): Promise<void> {
    try {
      await this.repo.create(Keys.checkpoint(record.groupId, record.checkpointId), record);
    } catch (err) {
      if (!(err instanceof CasConflictError)) throw err;
    }
  }

  /** Delete the record stored under `key` at `revision` (retention, after chunks and manifest). */
  delete(key: string, revision: number): Promise<void> {
    return this.repo.delete(key, revision);
  }
}
