package treediff

import (
	"context"
	"fmt"

	"github.com/esf-dev/esf/cas"
)

// Apply stages c on b. Applying, in order, every change that DiffWith(a, x)
// reports with Expand set to a Builder started on a, then writing it, yields
// exactly x: same entries, attributes and hard-link groups, so the same id.
// Without Expand an added directory arrives empty.
//
// Hard links: a non-directory whose New.LinkGroup names another path joins
// the group of the entry staged there (which depth-first order has already
// staged), keeping its own attributes; the Builder renames and recounts the
// groups on Write. This reproduces x when the members of each group agree
// on content, as every importer and Builder.Link produce them.
func Apply(ctx context.Context, b *cas.Builder, c Change) error {
	if c.Kind == Deleted || c.New == nil {
		if c.Path == "" {
			return fmt.Errorf("apply: cannot delete the root: %w", ErrInvalidArgument)
		}
		if err := b.Delete(ctx, c.Path); err != nil {
			return fmt.Errorf("apply %s %s: %w", c.Kind, c.Path, err)
		}
		return nil
	}
	e := *c.New
	if e.Type == cas.TypeDir {
		// Only the attributes matter: Put keeps an existing directory's
		// entries and replaces anything else with an empty directory.
		if err := b.Put(ctx, c.Path, cas.Entry{Type: cas.TypeDir, Attr: e.Attr}, ""); err != nil {
			return fmt.Errorf("apply %s %s: %w", c.Kind, c.Path, err)
		}
		return nil
	}
	key, err := applyLinkKey(ctx, b, c)
	if err != nil {
		return fmt.Errorf("apply %s %s: %w", c.Kind, c.Path, err)
	}
	e.LinkGroup, e.Nlink = "", 0
	if err := b.Put(ctx, c.Path, e, key); err != nil {
		return fmt.Errorf("apply %s %s: %w", c.Kind, c.Path, err)
	}
	return nil
}

// applyLinkKey finds the Builder link key that puts c.New into its group.
func applyLinkKey(ctx context.Context, b *cas.Builder, c Change) (string, error) {
	group := c.New.LinkGroup
	switch {
	case group == "":
		return "", nil
	case group == c.Path:
		// The first member. If it led the same group before, keep its key
		// so unchanged members still join it; otherwise a new group starts
		// here and later members look it up.
		if c.Old != nil && c.Old.Type != cas.TypeDir && c.Old.LinkGroup == group {
			_, key, _, err := b.Lookup(ctx, c.Path)
			return key, err
		}
		return "", nil
	}
	first, key, ok, err := b.Lookup(ctx, group)
	if err != nil {
		return "", err
	}
	if !ok || first.Type == cas.TypeDir {
		return "", fmt.Errorf("link group %q: no such member staged: %w", group, ErrInvalidArgument)
	}
	if key == "" {
		// Give the first member an identity: Link does, then we put our
		// own entry (with its own attributes) over the linked one.
		if err := b.Link(ctx, c.Path, group); err != nil {
			return "", err
		}
		if _, key, _, err = b.Lookup(ctx, group); err != nil {
			return "", err
		}
	}
	return key, nil
}
