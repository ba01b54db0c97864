package guest

import (
	"bufio"
	"context"
	"net"

	"github.com/emberbox/emberbox/internal/agentproto"
)

// VolumeHandler is the optional capability of an EgressHandler to serve the
// volume.nbd streams a guest opens (found by type assertion): attachmentID
// is what the guest asked for, unchecked. accept answers the guest (nil:
// served, after which c carries NBD); the handler must call it once
// before serving.
type VolumeHandler interface {
	ServeVolume(ctx context.Context, attachmentID string, c net.Conn, br *bufio.Reader, accept func(error) error)
}

// AttachVolume makes the agent connect a volume's device, stream its blocks
// from the host (see VolumeHandler) and mount it at req.Path.
func (c *Client) AttachVolume(ctx context.Context, req agentproto.VolumeRequest) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodVolumeAttach, Volume: &req}, ordinaryReply)
	return err
}

// DetachVolume makes the agent sync, unmount and disconnect an attached
// volume; a mount in use is refused with code agentproto.CodeBusy.
func (c *Client) DetachVolume(ctx context.Context, attachmentID string) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodVolumeDetach,
		Volume: &agentproto.VolumeRequest{AttachmentID: attachmentID}}, ordinaryReply)
	return err
}

// FreezeVolume freezes (freeze) or thaws an attached volume's filesystem.
func (c *Client) FreezeVolume(ctx context.Context, attachmentID string, freeze bool) error {
	m := agentproto.MethodVolumeThaw
	if freeze {
		m = agentproto.MethodVolumeFreeze
	}
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: m, Volume: &agentproto.VolumeRequest{AttachmentID: attachmentID}}, ordinaryReply)
	return err
}

// SyncVolumes flushes every volume attached in the guest.
func (c *Client) SyncVolumes(ctx context.Context) error {
	_, err := c.roundTrip(ctx, &agentproto.Request{Method: agentproto.MethodVolumeSync}, ordinaryReply)
	return err
}

// serveVolume hands a volume.nbd stream to h, if it serves volumes; false
// for a request that names no attachment.
func serveVolume(ctx context.Context, h EgressHandler, fc *agentproto.Conn, st net.Conn, req *agentproto.Request) bool {
	refuse := agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodeInvalid, Message: "no such volume"}}
	if req.Volume == nil || req.Volume.AttachmentID == "" || len(req.Volume.AttachmentID) > 64 {
		_ = fc.WriteJSON(refuse)
		return false // a malformed request: a violation
	}
	vh, ok := h.(VolumeHandler)
	if !ok {
		_ = fc.WriteJSON(refuse)
		return true
	}
	vh.ServeVolume(ctx, req.Volume.AttachmentID, st, fc.Reader(), func(err error) error {
		if err != nil {
			return fc.WriteJSON(agentproto.Reply{Error: &agentproto.Error{Code: agentproto.CodePermission, Message: "volume not attached here"}})
		}
		return fc.WriteJSON(agentproto.Reply{OK: true})
	})
	return true
}
