// Peer benchmark driver for scripts/bench/river.sh (run it through that
// script, which builds this program).
//
// In a fresh database: run River's migrations and queue -jobs jobs (untimed),
// then start a River client with -max-workers workers and time from Start
// until every job has completed.  -mode says what a job is:
//
//	noop      one stage: a worker that does nothing;
//	chain     two stages: the first job's worker inserts the second job
//	          (ClientFromContext(ctx).Insert), whose worker does nothing;
//	chain-tx  two stages, transactionally: the first job's worker inserts the
//	          second job and completes itself in one transaction (InsertTx
//	          and JobCompleteTx), so the hand-over happens exactly once.
//
// A document is done when its last stage is.  Prints one JSON object on
// stdout; everything else goes to stderr.  The database is dropped afterwards.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

const (
	batch = 5_000
	// River's defaults (FetchCooldown 100 ms, FetchPollInterval 1 s) cap a
	// queue near 1,000 jobs/s: at most one fetch per cooldown.  These are
	// tuned for throughput, close to River's own benchmark (riverbench:
	// 2 ms, 20 ms).
	fetchCooldown     = 1 * time.Millisecond
	fetchPollInterval = 20 * time.Millisecond
	// A stall guard: fail rather than wait forever if completions stop.
	stallTimeout = 30 * time.Second
)

type noopArgs struct{}

func (noopArgs) Kind() string { return "noop" }

type noopWorker struct {
	river.WorkerDefaults[noopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[noopArgs]) error { return nil }

// The first stage of a chain; its worker hands over to secondArgs.
type firstArgs struct{}

func (firstArgs) Kind() string { return "first" }

type secondArgs struct{}

func (secondArgs) Kind() string { return "second" }

type secondWorker struct {
	river.WorkerDefaults[secondArgs]
}

func (secondWorker) Work(context.Context, *river.Job[secondArgs]) error { return nil }

// chainWorker inserts the second stage with the client from the context.
type chainWorker struct {
	river.WorkerDefaults[firstArgs]
}

func (chainWorker) Work(ctx context.Context, _ *river.Job[firstArgs]) error {
	_, err := river.ClientFromContext[pgx.Tx](ctx).Insert(ctx, secondArgs{}, nil)
	return err
}

// chainTxWorker inserts the second stage and completes the first in one
// transaction.
type chainTxWorker struct {
	river.WorkerDefaults[firstArgs]
	pool *pgxpool.Pool
}

func (w chainTxWorker) Work(ctx context.Context, job *river.Job[firstArgs]) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	if _, err := river.ClientFromContext[pgx.Tx](ctx).InsertTx(ctx, tx, secondArgs{}, nil); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// poolSize is the pool's connections for -max-conns: pgxpool's default,
// max(4, CPUs), when 0.
func poolSize(maxConns int) int {
	if maxConns > 0 {
		return maxConns
	}
	return max(4, runtime.NumCPU())
}

// stagesOf is how many jobs each document runs in mode, 0 for no such mode.
func stagesOf(mode string) int {
	switch mode {
	case "noop":
		return 1
	case "chain", "chain-tx":
		return 2
	}
	return 0
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[river] "+format+"\n", args...)
}

func main() {
	jobs := flag.Int("jobs", 0, "number of jobs (required)")
	maxWorkers := flag.Int("max-workers", 1000, "MaxWorkers of the default queue")
	adminURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL; the role must be able to create databases")
	mode := flag.String("mode", "noop", "noop, chain or chain-tx")
	maxConns := flag.Int("max-conns", 0, "the pool's connections (0: pgxpool's default, max(4, CPUs))")
	flag.Parse()
	stages := stagesOf(*mode)
	if *jobs < 1 || *maxWorkers < 1 || *adminURL == "" || stages == 0 {
		logf("usage: -jobs N [-mode noop|chain|chain-tx] [-max-workers W] [-database-url URL]")
		os.Exit(2)
	}

	// SIGINT/SIGTERM cancel ctx; the database is still dropped (own context).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	seconds, err := run(ctx, *adminURL, *mode, *jobs, *maxWorkers, int32(*maxConns))
	if err != nil {
		logf("ERROR: %v", err)
		os.Exit(1)
	}
	// A struct, not a map, so the fields keep this order.
	out, _ := json.Marshal(struct {
		Peer                string  `json:"peer"`
		Version             string  `json:"version"`
		Mode                string  `json:"mode"`
		Stages              int     `json:"stages"`
		Documents           int     `json:"documents"`
		Jobs                int     `json:"jobs"`
		MaxWorkers          int     `json:"max_workers"`
		MaxConns            int     `json:"max_conns"`
		FetchCooldownMs     int64   `json:"fetch_cooldown_ms"`
		FetchPollIntervalMs int64   `json:"fetch_poll_interval_ms"`
		Seconds             float64 `json:"seconds"`
		JobsPerS            float64 `json:"jobs_per_s"`
		DocumentsPerS       float64 `json:"documents_per_s"`
	}{
		"river", riverVersion(), *mode, stages, *jobs, *jobs * stages, *maxWorkers, poolSize(*maxConns),
		fetchCooldown.Milliseconds(), fetchPollInterval.Milliseconds(),
		math.Round(seconds*1000) / 1000, math.Round(float64(*jobs*stages) / seconds),
		math.Round(float64(*jobs) / seconds),
	})
	fmt.Println(string(out))
}

// run creates a scratch database, benchmarks in it and drops it.
func run(ctx context.Context, adminURL, mode string, jobs, maxWorkers int, maxConns int32) (seconds float64, err error) {
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return 0, fmt.Errorf("connecting: %w", err)
	}
	defer admin.Close(context.Background())

	db := fmt.Sprintf("river_bench_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		return 0, fmt.Errorf("creating database %s: %w", db, err)
	}
	logf("created database %s", db)
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, derr := admin.Exec(dctx, "DROP DATABASE IF EXISTS "+db+" WITH (FORCE)"); derr != nil {
			logf("dropping database %s: %v", db, derr)
			err = errors.Join(err, derr)
		} else {
			logf("dropped database %s", db)
		}
	}()

	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return 0, err
	}
	cfg.ConnConfig.Database = db
	// pgxpool's default size, max(4, CPUs), unless -max-conns: for no-op
	// jobs 20 connections measured no faster.
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	return bench(ctx, pool, mode, jobs, maxWorkers)
}

func bench(ctx context.Context, pool *pgxpool.Pool, mode string, jobs, maxWorkers int) (float64, error) {
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return 0, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return 0, fmt.Errorf("migrating: %w", err)
	}

	workers := river.NewWorkers()
	var first river.JobArgs = noopArgs{}
	switch mode {
	case "noop":
		river.AddWorker(workers, noopWorker{})
	case "chain":
		first = firstArgs{}
		river.AddWorker(workers, chainWorker{})
		river.AddWorker(workers, secondWorker{})
	case "chain-tx":
		first = firstArgs{}
		river.AddWorker(workers, chainTxWorker{pool: pool})
		river.AddWorker(workers, secondWorker{})
	}
	total := jobs * stagesOf(mode)
	client, err := river.NewClient(driver, &river.Config{
		FetchCooldown:     fetchCooldown,
		FetchPollInterval: fetchPollInterval,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: maxWorkers}},
		Workers:           workers,
		// Warnings and errors only, to stderr.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return 0, err
	}

	// Queue the jobs before starting the client: not timed.
	params := make([]river.InsertManyParams, batch)
	for i := range params {
		params[i] = river.InsertManyParams{Args: first}
	}
	for left := jobs; left > 0; left -= batch {
		if _, err := client.InsertManyFast(ctx, params[:min(batch, left)]); err != nil {
			return 0, fmt.Errorf("inserting: %w", err)
		}
	}
	logf("queued %d jobs; starting client (max workers %d)", jobs, maxWorkers)

	// Sends to a subscription never block: an event that finds the buffer
	// full is dropped.  Room for every job's event means none is lost, even
	// if this loop falls behind.
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: total,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed},
	})
	defer cancel()

	t0 := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, fmt.Errorf("starting client: %w", err)
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		if err := client.Stop(sctx); err != nil {
			logf("stopping client: %v", err)
		}
	}()

	stall := time.NewTimer(stallTimeout)
	for completed := 0; completed < total; {
		select {
		case ev := <-events:
			if ev.Kind == river.EventKindJobFailed {
				return 0, fmt.Errorf("job %d failed: %v", ev.Job.ID, ev.Job.Errors)
			}
			completed++
			stall.Reset(stallTimeout)
		case <-stall.C:
			return 0, fmt.Errorf("stalled: %d of %d jobs completed, none in %s", completed, total, stallTimeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	seconds := time.Since(t0).Seconds()
	logf("%d jobs (%d documents) completed in %.3f s", total, jobs, seconds)

	// Cross-check in the table; the completer's batched writes may lag the
	// events by a little.
	var n int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&n); err != nil {
			return 0, err
		}
		if n == total || time.Now().After(deadline) {
			break
		}
	}
	if n != total {
		return 0, fmt.Errorf("river_job has %d completed jobs, wanted %d", n, total)
	}
	return seconds, nil
}

// riverVersion is River's module version as built in, without the "v".
func riverVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == "github.com/riverqueue/river" {
				return strings.TrimPrefix(dep.Version, "v")
			}
		}
	}
	return "unknown"
}
