package server

import (
	"errors"
	"os"

	"github.com/berth-runtime/berth/sandbox/shim"
)

// API is what the shim serves; each method is one call of package shim's
// Client. Calls run concurrently, one goroutine each (shim.ServeConn).
type API struct{ s *Server }

// methods names the calls for shim.ServeConn.
func (a *API) methods() map[string]shim.Method {
	return map[string]shim.Method{
		"Info":           shim.NewMethod(a.Info),
		"Create":         shim.NewMethod(a.Create),
		"CreateRestored": shim.NewMethod(a.CreateRestored),
		"Start":          shim.NewMethod(a.Start),
		"Kill":           shim.NewMethod(a.Kill),
		"State":          shim.NewMethod(a.State),
		"Wait":           shim.NewMethod(a.Wait),
		"Delete":         shim.NewMethod(a.Delete),
		"Exec":           shim.NewMethod(a.Exec),
		"CancelExec":     shim.NewMethod(a.CancelExec),
		"Update":         shim.NewMethod(a.Update),
		"ReopenLog":      shim.NewMethod(a.ReopenLog),
		"Checkpoint":     shim.NewMethod(a.Checkpoint),
		"Events":         shim.NewMethod(a.Events),
		"Shutdown":       shim.NewMethod(a.Shutdown),
	}
}

func (a *API) Info(_ *shim.Empty, r *shim.Info) error {
	*r = shim.Info{Pid: os.Getpid(), PodDir: a.s.dir, Running: a.s.live()}
	return nil
}

func (a *API) Create(req *shim.CreateRequest, _ *shim.Empty) error {
	return a.s.create(req)
}

// CreateRestored is Create for a container restored from a checkpoint
// (req.Restore): a call of its own, which a shim from before restores
// refuses as unknown rather than start the container afresh.
func (a *API) CreateRestored(req *shim.CreateRequest, _ *shim.Empty) error {
	if req.Restore == nil {
		return errors.New("create restored: no checkpoint")
	}
	return a.s.create(req)
}

func (a *API) Start(req *shim.IDRequest, r *shim.State) (err error) {
	*r, err = a.s.start(req.ID)
	return err
}

func (a *API) Kill(req *shim.KillRequest, _ *shim.Empty) error {
	return a.s.kill(req)
}

func (a *API) State(req *shim.IDRequest, r *shim.State) (err error) {
	*r, err = a.s.state(req.ID)
	return err
}

func (a *API) Wait(req *shim.WaitRequest, r *shim.State) (err error) {
	*r, err = a.s.wait(req)
	return err
}

func (a *API) Delete(req *shim.IDRequest, _ *shim.Empty) error {
	return a.s.delete(req.ID)
}

func (a *API) Exec(req *shim.ExecRequest, r *shim.ExecResponse) (err error) {
	*r, err = a.s.exec(req)
	return err
}

func (a *API) CancelExec(req *shim.CancelRequest, _ *shim.Empty) error {
	a.s.cancelExec(req.Token)
	return nil
}

func (a *API) Update(req *shim.UpdateRequest, _ *shim.Empty) error {
	return a.s.update(req)
}

func (a *API) ReopenLog(req *shim.IDRequest, _ *shim.Empty) error {
	return a.s.reopenLog(req.ID)
}

func (a *API) Checkpoint(req *shim.CheckpointRequest, _ *shim.Empty) error {
	return a.s.checkpoint(req)
}

// Events returns the container events after req.After once there are
// any, or when the shim quits. berthd keeps one call parked: it learns of
// every change at once, and of the shim's end (quit, or a death that
// breaks the connection).
func (a *API) Events(req *shim.EventsRequest, r *shim.EventsReply) error {
	*r = a.s.nextEvents(req)
	return nil
}

func (a *API) Shutdown(_ *shim.Empty, _ *shim.Empty) error {
	return a.s.shutdown()
}
