package sandbox

import (
	"context"
	"io"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// Exec implements api.Manager.Exec.
func (m *Manager) Exec(ctx context.Context, owner, id string, req agentproto.ExecRequest, onEvent func(agentproto.Event) error) (*agentproto.ExecResult, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Exec(ctx, req, onEvent)
}

// Spawn implements api.Manager.Spawn.
func (m *Manager) Spawn(ctx context.Context, owner, id string, req agentproto.ExecRequest) (*agentproto.ProcessInfo, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Spawn(ctx, req)
}

// Processes implements api.Manager.Processes.
func (m *Manager) Processes(ctx context.Context, owner, id string) ([]agentproto.ProcessInfo, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Processes(ctx)
}

// Process implements api.Manager.Process.
func (m *Manager) Process(ctx context.Context, owner, id, processID string) (*agentproto.ProcessInfo, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Process(ctx, processID)
}

// ProcessOutput implements api.Manager.ProcessOutput.
func (m *Manager) ProcessOutput(ctx context.Context, owner, id string, req agentproto.ProcessRequest, onEvent func(agentproto.Event) error) error {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return err
	}
	return c.ProcessOutput(ctx, req, onEvent)
}

// Signal implements api.Manager.Signal.
func (m *Manager) Signal(ctx context.Context, owner, id, processID, signal string) (*agentproto.ProcessInfo, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Signal(ctx, processID, signal)
}

// ReadFile implements api.Manager.ReadFile.
func (m *Manager) ReadFile(ctx context.Context, owner, id, path string) (*agentproto.FileEntry, io.ReadCloser, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, nil, err
	}
	return c.ReadFile(ctx, path)
}

// WriteFile implements api.Manager.WriteFile.
func (m *Manager) WriteFile(ctx context.Context, owner, id, path string, mode uint32, size int64, r io.Reader) (*agentproto.FileEntry, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.WriteFile(ctx, path, mode, size, r)
}

// ListFiles implements api.Manager.ListFiles.
func (m *Manager) ListFiles(ctx context.Context, owner, id string, req agentproto.FileRequest) ([]agentproto.FileEntry, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.List(ctx, req)
}

// Stat implements api.Manager.Stat.
func (m *Manager) Stat(ctx context.Context, owner, id, path string) (*agentproto.FileEntry, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Stat(ctx, path)
}

// Mkdir implements api.Manager.Mkdir.
func (m *Manager) Mkdir(ctx context.Context, owner, id, path string, parents bool) (*agentproto.FileEntry, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return nil, err
	}
	return c.Mkdir(ctx, path, parents)
}

// Remove implements api.Manager.Remove.
func (m *Manager) Remove(ctx context.Context, owner, id, path string, recursive bool) (bool, error) {
	c, err := m.client(ctx, owner, id)
	if err != nil {
		return false, err
	}
	return c.Remove(ctx, path, recursive)
}
