package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane acl`: tokens and roles, when the agents run with --acl.

var roleNames = []string{"read", "auditor", "operator", "admin"}

func newACLCommand(g *globals) *cobra.Command {
	return newGroupCommand("acl", "Manage API tokens and roles (agents started with --acl)", nil,
		newACLBootstrapCommand(g),
		newGroupCommand("token", "Create, list, show and delete tokens", []string{"tokens"},
			newTokenCreateCommand(g),
			newTokenListCommand(g),
			newTokenGetCommand(g),
			newTokenDeleteCommand(g),
		),
		newWhoAmICommand(g),
	)
}

func newACLBootstrapCommand(g *globals) *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "bootstrap",
		Short: "Create the first admin token (once per cluster); prints its secret",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.ACL.Bootstrap(ctx(cmd), connect.NewRequest(&pb.BootstrapRequest{Name: name}))
			if err != nil {
				return err
			}
			return g.printSecret(resp.Msg.GetToken(), resp.Msg.GetSecret())
		},
	}
	c.Flags().StringVar(&name, "name", "admin", "name of the admin token (the actor its changes are logged under)")
	return c
}

func newTokenCreateCommand(g *globals) *cobra.Command {
	var name, role, tenant string
	var weight float64
	c := &cobra.Command{
		Use:   "create --name NAME --role read|auditor|operator|admin [--tenant T] [--weight W]",
		Short: "Create a token; prints its secret, which is never shown again",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if name == "" {
				return usageErrorf(cmd, "--name is required")
			}
			r, ok := parseRole(role)
			if !ok {
				return usageErrorf(cmd, "invalid --role %q: want %s", role, strings.Join(roleNames, ", "))
			}
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			req := &pb.CreateTokenRequest{Name: name, Role: r, Tenant: tenant}
			// Sent only when given, so the server checks an explicit
			// --weight 0 rather than taking it for the default.
			if cmd.Flags().Changed("weight") {
				req.Weight = &weight
			}
			resp, err := api.ACL.CreateToken(ctx(cmd), connect.NewRequest(req))
			if err != nil {
				return err
			}
			return g.printSecret(resp.Msg.GetToken(), resp.Msg.GetSecret())
		},
	}
	c.Flags().StringVar(&name, "name", "", "token name: the actor its changes are logged under")
	c.Flags().StringVar(&role, "role", "", "read (a tenant's key: sees its own tenant's data and the cluster's nodes and devices, changes nothing), auditor (sees everything, changes nothing), operator (also accelerators and deployments) or admin (also nodes, tokens and the cluster)")
	c.Flags().StringVar(&tenant, "tenant", "", "the gateway tenant its requests are served as (default: the token's name)")
	c.Flags().Float64Var(&weight, "weight", fsm.DefaultTokenWeight, fmt.Sprintf("the tenant's weight in the gateway's fair queues, above 0 and at most %s", fsm.FormatWeight(fsm.MaxTokenWeight)))
	_ = c.RegisterFlagCompletionFunc("role", cobra.FixedCompletions(roleNames, cobra.ShellCompDirectiveNoFileComp))
	return c
}

func newTokenListCommand(g *globals) *cobra.Command {
	return listCommand(g, "List tokens by name, role and tenant (never their secrets)",
		func(c context.Context, api *apiClients, stale bool) ([]*pb.ACLToken, error) {
			resp, err := answer(api.ACL.ListTokens(c, connect.NewRequest(&pb.ListTokensRequest{Stale: stale})))
			return resp.GetTokens(), err
		}, tokenTable)
}

func newTokenGetCommand(g *globals) *cobra.Command {
	return getCommand(g, "Show one token's role and tenant (never its secret)", tokenNames,
		func(c context.Context, api *apiClients, name string, stale bool) (*pb.ACLToken, error) {
			resp, err := answer(api.ACL.ListTokens(c, connect.NewRequest(&pb.ListTokensRequest{Stale: stale})))
			if err != nil {
				return nil, err
			}
			for _, t := range resp.GetTokens() {
				if t.GetName() == name {
					return t, nil
				}
			}
			return nil, fmt.Errorf("token %q not found", name)
		}, func(t *pb.ACLToken) detail { return detailOf(tokenTable([]*pb.ACLToken{t})) })
}

// tokenNames completes a token's name.
func tokenNames(cmd *cobra.Command, api *apiClients) ([]string, error) {
	resp, err := answer(api.ACL.ListTokens(ctx(cmd), connect.NewRequest(&pb.ListTokensRequest{Stale: true})))
	return namesOf(resp.GetTokens(), err)
}

// tokenTable shows tokens with the tenant and weight the gateway serves
// them as (the server fills in the defaults).
func tokenTable(toks []*pb.ACLToken) table {
	return tableOf([]string{"NAME", "ROLE", "TENANT", "WEIGHT", "CREATED"}, toks, func(t *pb.ACLToken) []string {
		tenant, weight := fsm.TokenTenant(t)
		return []string{t.GetName(), fsm.RoleString(t.GetRole()), tenant, fsm.FormatWeight(weight), itoa(t.GetCreatedIndex())}
	})
}

func newTokenDeleteCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a token: its secret stops working at once",
		Args:  argsNamed("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			if _, err := api.ACL.DeleteToken(ctx(cmd), connect.NewRequest(&pb.DeleteTokenRequest{Name: args[0]})); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "token/%s deleted\n", args[0])
			return nil
		},
	}
}

func newWhoAmICommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Show the actor and role the agent sees for --token",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.ACL.WhoAmI(ctx(cmd), connect.NewRequest(&pb.WhoAmIRequest{}))
			if err != nil {
				return err
			}
			m := resp.Msg
			return g.printObject(m, table{header: []string{"ACTOR", "ROLE", "ACLS"}, rows: [][]string{{
				m.GetActor(), orDash(roleOrEmpty(m.GetRole())), map[bool]string{true: "on", false: "off"}[m.GetAclEnabled()],
			}}})
		},
	}
}

// printSecret prints a new token with its secret, which the server never
// shows again.
func (g *globals) printSecret(tok *pb.ACLToken, secret string) error {
	tenant, weight := fsm.TokenTenant(tok)
	return g.printValue(map[string]any{"name": tok.GetName(), "role": fsm.RoleString(tok.GetRole()), "tenant": tenant, "weight": weight,
		"secret": secret, "index": tok.GetCreatedIndex()},
		func(w io.Writer) error {
			fmt.Fprintf(w, "token/%s created with role %s, tenant %s, weight %s\n", tok.GetName(), fsm.RoleString(tok.GetRole()), tenant, fsm.FormatWeight(weight))
			fmt.Fprintf(w, "secret: %s\n", secret)
			fmt.Fprintln(w, "Save the secret now: it is not shown again. Use it with --token or GPUPLANE_TOKEN.")
			return nil
		})
}

func parseRole(s string) (pb.Role, bool) {
	switch strings.ToLower(s) {
	case "read":
		return pb.Role_ROLE_READ, true
	case "auditor":
		return pb.Role_ROLE_AUDITOR, true
	case "operator":
		return pb.Role_ROLE_OPERATOR, true
	case "admin":
		return pb.Role_ROLE_ADMIN, true
	}
	return pb.Role_ROLE_UNSPECIFIED, false
}

func roleOrEmpty(r pb.Role) string {
	if r == pb.Role_ROLE_UNSPECIFIED {
		return ""
	}
	return fsm.RoleString(r)
}
