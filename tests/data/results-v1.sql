-- A results.db as rpg wrote it before the store kept a schema version (schema version 1):
-- the SQL dump (sqlite3 iterdump) of a database made by that store module, run paths made relative.
BEGIN TRANSACTION;
CREATE TABLE evals (
	run_id VARCHAR(64) NOT NULL, 
	step INTEGER NOT NULL, 
	benchmark VARCHAR(100) NOT NULL, 
	metric VARCHAR(16) NOT NULL, 
	k INTEGER NOT NULL, 
	scorer VARCHAR(100) NOT NULL, 
	value FLOAT, 
	scorer_version VARCHAR(100), 
	PRIMARY KEY (run_id, step, benchmark, metric, k, scorer), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);
INSERT INTO "evals" VALUES('v1run001',4,'aime24','mean@k',4,'dapo',0.25,'dapo-1');
INSERT INTO "evals" VALUES('v1run001',4,'aime24','pass@k',1,'dapo',0.25,'dapo-1');
INSERT INTO "evals" VALUES('v1run001',4,'aime24','pass@k',4,'dapo',0.75,'dapo-1');
CREATE TABLE metric_files (
	run_id VARCHAR(64) NOT NULL, 
	path VARCHAR(1000) NOT NULL, 
	"offset" BIGINT NOT NULL, 
	last_step INTEGER, 
	PRIMARY KEY (run_id), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);
INSERT INTO "metric_files" VALUES('v1run001','runs/old/metrics.jsonl',352,4);
INSERT INTO "metric_files" VALUES('v1run002','runs/old/metrics.jsonl',352,4);
INSERT INTO "metric_files" VALUES('v1run003','runs/old/metrics.jsonl',352,4);
CREATE TABLE metrics (
	run_id VARCHAR(64) NOT NULL, 
	"key" VARCHAR(200) NOT NULL, 
	step INTEGER NOT NULL, 
	value FLOAT, 
	PRIMARY KEY (run_id, "key", step), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
)
 WITHOUT ROWID

;
INSERT INTO "metrics" VALUES('v1run001','actor/pg_loss',1,-1.0);
INSERT INTO "metrics" VALUES('v1run001','actor/pg_loss',2,-2.0);
INSERT INTO "metrics" VALUES('v1run001','actor/pg_loss',3,-3.0);
INSERT INTO "metrics" VALUES('v1run001','actor/pg_loss',4,-4.0);
INSERT INTO "metrics" VALUES('v1run001','critic/score/mean',1,0.1);
INSERT INTO "metrics" VALUES('v1run001','critic/score/mean',2,0.2);
INSERT INTO "metrics" VALUES('v1run001','critic/score/mean',3,0.3);
INSERT INTO "metrics" VALUES('v1run001','critic/score/mean',4,0.4);
INSERT INTO "metrics" VALUES('v1run001','val-core/aime2025/acc/mean@32',2,0.1);
INSERT INTO "metrics" VALUES('v1run001','val-core/aime2025/acc/mean@32',4,0.2);
INSERT INTO "metrics" VALUES('v1run002','actor/pg_loss',1,-1.0);
INSERT INTO "metrics" VALUES('v1run002','actor/pg_loss',2,-2.0);
INSERT INTO "metrics" VALUES('v1run002','actor/pg_loss',3,-3.0);
INSERT INTO "metrics" VALUES('v1run002','actor/pg_loss',4,-4.0);
INSERT INTO "metrics" VALUES('v1run002','critic/score/mean',1,0.1);
INSERT INTO "metrics" VALUES('v1run002','critic/score/mean',2,0.2);
INSERT INTO "metrics" VALUES('v1run002','critic/score/mean',3,0.3);
INSERT INTO "metrics" VALUES('v1run002','critic/score/mean',4,0.4);
INSERT INTO "metrics" VALUES('v1run002','val-core/aime2025/acc/mean@32',2,0.1);
INSERT INTO "metrics" VALUES('v1run002','val-core/aime2025/acc/mean@32',4,0.2);
INSERT INTO "metrics" VALUES('v1run003','actor/pg_loss',1,-1.0);
INSERT INTO "metrics" VALUES('v1run003','actor/pg_loss',2,-2.0);
INSERT INTO "metrics" VALUES('v1run003','actor/pg_loss',3,-3.0);
INSERT INTO "metrics" VALUES('v1run003','actor/pg_loss',4,-4.0);
INSERT INTO "metrics" VALUES('v1run003','critic/score/mean',1,0.1);
INSERT INTO "metrics" VALUES('v1run003','critic/score/mean',2,0.2);
INSERT INTO "metrics" VALUES('v1run003','critic/score/mean',3,0.3);
INSERT INTO "metrics" VALUES('v1run003','critic/score/mean',4,0.4);
INSERT INTO "metrics" VALUES('v1run003','val-core/aime2025/acc/mean@32',2,0.1);
INSERT INTO "metrics" VALUES('v1run003','val-core/aime2025/acc/mean@32',4,0.2);
CREATE TABLE runs (
	id VARCHAR(64) NOT NULL, 
	sweep VARCHAR(200) NOT NULL, 
	name VARCHAR(300) NOT NULL, 
	spec JSON NOT NULL, 
	backend VARCHAR(16) NOT NULL, 
	run_dir VARCHAR(1000) NOT NULL, 
	status VARCHAR(16) NOT NULL, 
	submission_id VARCHAR(100), 
	attempts INTEGER NOT NULL, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	error TEXT, 
	PRIMARY KEY (id), 
	CONSTRAINT runs_status CHECK (status IN ('pending', 'submitted', 'running', 'succeeded', 'failed', 'stopped')), 
	FOREIGN KEY(sweep) REFERENCES sweeps (name)
);
INSERT INTO "runs" VALUES('v1run001','old','rpg-urkl-s1-v1run001','{"algorithm": "rpg", "kl": "urkl", "seed": 1, "model": "Qwen/Qwen3-4B", "context": "4k", "optimizer": "adamw", "clip": {"eps_low": 0.2, "eps_high": 0.28, "c": 10.0}}','local','runs/old/rpg-urkl-s1-v1run001','succeeded','v1run001',0,'2026-11-23 08:44:15.972594','2025-01-02 03:04:05.000000','2025-01-02 04:04:05.000000',NULL);
INSERT INTO "runs" VALUES('v1run002','old','rpg-urkl-s2-v1run002','{"algorithm": "rpg", "kl": "urkl", "seed": 2, "model": "Qwen/Qwen3-4B", "context": "4k", "optimizer": "adamw", "clip": {"eps_low": 0.2, "eps_high": 0.28, "c": 10.0}}','local','runs/old/rpg-urkl-s2-v1run002','failed','v1run002',0,'2026-11-23 08:44:15.974973','2025-01-02 03:04:05.000000','2025-01-02 03:04:05.000000','Traceback ...
ValueError: boom');
INSERT INTO "runs" VALUES('v1run003','other','rpg-urkl-s3-v1run003','{"algorithm": "rpg", "kl": "urkl", "seed": 3, "model": "Qwen/Qwen3-4B", "context": "4k", "optimizer": "adamw", "clip": {"eps_low": 0.2, "eps_high": 0.28, "c": 10.0}}','local','runs/other/rpg-urkl-s3-v1run003','running','v1run003',0,'2026-11-23 08:44:15.980817','2025-01-02 03:04:05.000000',NULL,NULL);
CREATE TABLE samples (
	run_id VARCHAR(64) NOT NULL, 
	step INTEGER NOT NULL, 
	benchmark VARCHAR(100) NOT NULL, 
	problem INTEGER NOT NULL, 
	sample_index INTEGER NOT NULL, 
	scorer VARCHAR(100) NOT NULL, 
	extracted TEXT, 
	correct BOOLEAN NOT NULL, 
	response_length INTEGER, 
	PRIMARY KEY (run_id, step, benchmark, problem, sample_index, scorer), 
	FOREIGN KEY(run_id) REFERENCES runs (id) ON DELETE CASCADE
);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',0,0,'dapo','0',1,10);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',0,1,'dapo','1',0,11);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',0,2,'dapo','2',0,12);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',0,3,'dapo','3',0,13);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',1,0,'dapo','0',0,10);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',1,1,'dapo','1',1,11);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',1,2,'dapo','2',0,12);
INSERT INTO "samples" VALUES('v1run001',4,'aime24',1,3,'dapo','3',0,13);
CREATE TABLE sweeps (
	name VARCHAR(200) NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (name)
);
INSERT INTO "sweeps" VALUES('old','2026-11-23 08:44:15.966491');
INSERT INTO "sweeps" VALUES('other','2026-11-23 08:44:15.975890');
CREATE INDEX ix_runs_sweep ON runs (sweep);
COMMIT;
