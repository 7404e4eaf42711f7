// Peer benchmark driver for scripts/bench/river.sh (run it through that
// script, which builds this program).
//
// In a fresh database: run River's migrations and queue -jobs no-op jobs
// (untimed), then start a River client with -max-workers workers and time from
// Start until every job has completed.  Prints one JSON object on stdout;
// everything else goes to stderr.  The database is dropped afterwards.
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

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[river] "+format+"\n", args...)
}

func main() {
	jobs := flag.Int("jobs", 0, "number of jobs (required)")
	maxWorkers := flag.Int("max-workers", 1000, "MaxWorkers of the default queue")
	adminURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "Postgres URL; the role must be able to create databases")
	flag.Parse()
	if *jobs < 1 || *maxWorkers < 1 || *adminURL == "" {
		logf("usage: -jobs N [-max-workers W] [-database-url URL]")
		os.Exit(2)
	}

	// SIGINT/SIGTERM cancel ctx; the database is still dropped (own context).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	seconds, err := run(ctx, *adminURL, *jobs, *maxWorkers)
	if err != nil {
		logf("ERROR: %v", err)
		os.Exit(1)
	}
	// A struct, not a map, so the fields keep this order.
	out, _ := json.Marshal(struct {
		Peer                string  `json:"peer"`
		Version             string  `json:"version"`
		Jobs                int     `json:"jobs"`
		MaxWorkers          int     `json:"max_workers"`
		FetchCooldownMs     int64   `json:"fetch_cooldown_ms"`
		FetchPollIntervalMs int64   `json:"fetch_poll_interval_ms"`
		Seconds             float64 `json:"seconds"`
		JobsPerS            float64 `json:"jobs_per_s"`
	}{
		"river", riverVersion(), *jobs, *maxWorkers,
		fetchCooldown.Milliseconds(), fetchPollInterval.Milliseconds(),
		math.Round(seconds*1000) / 1000, math.Round(float64(*jobs) / seconds),
	})
	fmt.Println(string(out))
}

// run creates a scratch database, benchmarks in it and drops it.
func run(ctx context.Context, adminURL string, jobs, maxWorkers int) (seconds float64, err error) {
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
	// pgxpool's default size, max(4, CPUs): 20 connections measured no faster.
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	return bench(ctx, pool, jobs, maxWorkers)
}

func bench(ctx context.Context, pool *pgxpool.Pool, jobs, maxWorkers int) (float64, error) {
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return 0, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return 0, fmt.Errorf("migrating: %w", err)
	}

	workers := river.NewWorkers()
	river.AddWorker(workers, noopWorker{})
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
		params[i] = river.InsertManyParams{Args: noopArgs{}}
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
		ChanSize: jobs,
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
	for completed := 0; completed < jobs; {
		select {
		case ev := <-events:
			if ev.Kind == river.EventKindJobFailed {
				return 0, fmt.Errorf("job %d failed: %v", ev.Job.ID, ev.Job.Errors)
			}
			completed++
			stall.Reset(stallTimeout)
		case <-stall.C:
			return 0, fmt.Errorf("stalled: %d of %d jobs completed, none in %s", completed, jobs, stallTimeout)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	seconds := time.Since(t0).Seconds()
	logf("%d jobs completed in %.3f s", jobs, seconds)

	// Cross-check in the table; the completer's batched writes may lag the
	// events by a little.
	var n int
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM river_job WHERE state = 'completed'").Scan(&n); err != nil {
			return 0, err
		}
		if n == jobs || time.Now().After(deadline) {
			break
		}
	}
	if n != jobs {
		return 0, fmt.Errorf("river_job has %d completed jobs, wanted %d", n, jobs)
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
