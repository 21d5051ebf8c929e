package flowcontrol

import (
	"errors"
	"fmt"
)

// Sentinel errors. Callers branch on them with errors.Is; the errors returned
// may wrap them with detail (the configuration field, the context's error).
var (
	// ErrInvalidConfig is wrapped by every configuration error of
	// NewDispatcher, NewController and PolicyByName; the message names the
	// offending field.
	ErrInvalidConfig = errors.New("flowcontrol: invalid configuration")
	// ErrUnknownBand is returned for a band outside [0, Bands).
	ErrUnknownBand = errors.New("flowcontrol: unknown band")
	// ErrQueueFull is returned when the band already holds Capacity items.
	ErrQueueFull = errors.New("flowcontrol: queue full")
	// ErrClosed is returned by Enqueue and Wait after Close, by Run once the
	// dispatcher is closed, and is the drop reason of items still queued at
	// Close.
	ErrClosed = errors.New("flowcontrol: closed")
	// ErrExpired is the outcome of an item that waited longer than its
	// band's MaxWait.
	ErrExpired = errors.New("flowcontrol: max wait expired")
	// ErrCancelled is the outcome of an item whose owner gave up (its Live
	// hook returned false; for Controller.Wait, its context ended). The
	// error returned by Wait also wraps the context's error, so
	// errors.Is(err, context.Canceled) works too.
	ErrCancelled = errors.New("flowcontrol: cancelled")
	// ErrNotRunning is returned by Controller.Wait when no Run is going
	// and the controller was not configured as Stepped: without a tick
	// nothing would ever release the request.
	ErrNotRunning = errors.New("flowcontrol: not running (start Run, or set ControllerConfig.Stepped and call Step)")
	// ErrShed is returned by Controller.Wait when the controller's Admitter
	// refused the request before the queue (ControllerConfig.Admitter).
	ErrShed = errors.New("flowcontrol: shed")
	// ErrRunning is returned by Run when another Run is already going.
	ErrRunning = errors.New("flowcontrol: already running")
	// ErrFlowFull is returned by EnqueueFlow and Controller.WaitRequest
	// when the item's flow already holds its band's FlowCapacity items. It
	// wraps ErrQueueFull, so a host mapping ErrQueueFull to 429 needs no
	// change; it is counted in BandStats.FlowFull, not BandStats.Rejected.
	ErrFlowFull = fmt.Errorf("%w: the flow holds its FlowCapacity", ErrQueueFull)
)
